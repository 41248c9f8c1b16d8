// The per-optimizer bookkeeping of one iteration: torch's stage machine and the inf checks that
// unscale_ records. Shared by LocalGradScaler (one thread) and the optimizer actor (inside step
// jobs), so both refuse misuse with the same texts and decide skips the same way.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <ampactor/core/stage.h>
#include <ampactor/scaler/ranks.h>

namespace torch::optim {
class Optimizer;
}

namespace ampactor {

/// How large one optimizer's gradients were when unscaled (UnscaleDone's grad_max, dtype_max):
/// the largest finite |gradient| as made at the scale, and the largest finite value of its dtype.
/// With several dtypes, the one whose gradients came nearest to overflow. dtype_max 0: unknown.
struct GradSize {
  double max = 0;
  double dtype_max = 0;
};

/// The largest finite value of a gradient dtype (fp16, bf16, fp32, fp64); 0 for any other.
double dtype_max_of(c10::ScalarType t);

/// Gradient sizes as measured, one entry per dtype (and device): (that dtype's largest finite
/// value, the kernels' grad_absmax, a 0-dim tensor). A size is comparable with its own dtype's
/// largest value only.
using AbsmaxList = std::vector<std::pair<double, at::Tensor>>;

/// check_finite of `grads` (one device) into `found`, measuring them: one grad_absmax per dtype
/// is appended to `absmax` as (that dtype's largest finite value, the max), a size being
/// comparable with its own dtype's largest value only.
/// The overflow attribution of one kernel call: flags[j] (kernels::kHeldInf, kHeldNaN) is that
/// of params[j] (in a record, the optimizer's parameter index in param-group order).
struct Attributed {
  at::Tensor flags;
  std::vector<std::size_t> params;
};

/// `attributed`: where each call's overflow attribution goes (Attributed::params are positions
/// in `grads`), or null.
void check_measured(const std::vector<at::Tensor>& grads, at::Tensor& found, AbsmaxList& absmax,
                    std::vector<Attributed>* attributed = nullptr);

/// The pipeline's grad move for a list of masters: model_grads[i] (any float dtype; undefined =
/// none) into masters[i].grad() as fp32, unscaled by `inv_scale` and checked into `found` in one
/// pass, measured into `absmax` as check_measured does. adopt: see
/// StepTracker::move_and_unscale_. Nothing is installed unless every check passes.
void move_measured(const std::vector<at::Tensor>& model_grads,
                   const std::vector<at::Tensor>& masters, float inv_scale, at::Tensor& found,
                   AbsmaxList& absmax, bool adopt = false);

/// How an iteration's gradients were handled, by case (OptimizerRecord::grads).
/// Unscaled in place (torch's unscale_, the pipeline's move): they hold their true size.
struct InPlace {};
/// Checked for a fused step (ampactor::optim), which unscales them itself: still at the scale.
struct AtScale {
  /// What the fused step reads (empty: the optimizer's own grads).
  std::vector<at::Tensor> grads;
  /// Clipping's coefficient, which the step multiplies its inverse scale by (< 1: clipped).
  double grad_coef = 1;
};

/// What the ranks agreed on for one optimizer (data parallel).
struct Agreement {
  bool local_found_inf = false;  // this rank's own check; found_inf_per_device holds the agreed
  GradSize size;                 // the largest gradient size of all ranks
  std::vector<std::int32_t> found_by;  // the ranks whose own check found inf or NaN
};

/// The pipeline's part: the weights a fused step writes in its own pass (empty: none), and
/// whether it did.
struct StepWeights {
  std::vector<at::Tensor> weights;
  bool written = false;
};

/// Per-optimizer record between two update() calls: torch's stage and found_inf per device, what
/// the kernels measured, how the gradients were handled, the ranks' agreement, the pipeline's
/// weights.
struct OptimizerRecord {
  OptState stage = OptState::ready;
  /// One 1-element float tensor per device that had gradients (set by unscale_).
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  /// The kernels' grad_absmax per dtype and device: (that dtype's largest finite value, tensor).
  AbsmaxList absmax;
  /// Which gradients held inf or NaN, per device (empty where the path does not attribute).
  std::vector<Attributed> nonfinite;
  std::variant<InPlace, AtScale> grads;
  std::optional<Agreement> agreed;  // with ranks
  StepWeights weights;
  bool any_found_inf() const;
  /// Reads `absmax` (a device sync, as any_found_inf is); with ranks the agreed size.
  GradSize grad_size() const;
  bool at_scale() const { return std::holds_alternative<AtScale>(grads); }
};

/// unscale_'s results, before they become a record.
struct Unscaled {
  std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  AbsmaxList absmax;
  std::vector<Attributed> nonfinite;
};

/// What step() did with one optimizer.
struct StepOutcome {
  bool found_inf = false;
  bool skipped = false;
  /// The gradients were unscaled by this call (the optimizer was READY).
  bool unscaled_here = false;
  /// optimizer.step()'s return value; empty when skipped.
  std::optional<at::Tensor> ret;
};

class StepTracker {
 public:
  /// ranks: data parallel (GradScalerOptions::ranks). Every unscale's found_inf and gradient
  /// size become the largest of all ranks before anything decides on them, and the pipeline's
  /// grad move (move_and_unscale_) averages the moved gradients across the ranks first.
  explicit StepTracker(bool allow_fp16_grads = false, std::shared_ptr<RankGroup> ranks = nullptr);

  /// unscale_: refuses a second unscale_ or one after step(), else unscales every gradient of
  /// `opt` in place by `inv_scale` and records inf/NaN. Returns whether any was found.
  bool unscale_(torch::optim::Optimizer& opt, float inv_scale);
  /// The asynchronous pipeline's unscale: model_grads[i] (any float dtype; undefined = no grad)
  /// moved into masters[i].grad() as fp32, unscaled by `inv_scale` and checked in one pass, for
  /// the optimizer `opt` that owns the masters. Same stage rules and record as unscale_.
  /// adopt: the caller hands the model grads over. One that is fp32, contiguous, on its master's
  /// device and referenced by nothing else (no other tensor or view) is unscaled in place and
  /// becomes the master's gradient: no copy. The others are moved as usual. reduce: how the
  /// moved gradients are reduced across the ranks (GradReduce; unset: averaged).
  bool move_and_unscale_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                         std::vector<at::Tensor>& masters, float inv_scale, bool adopt = false,
                         const GradReduce& reduce = {});
  /// The pipeline's check for a fused optimizer (ampactor::optim): reads `grads` (one per
  /// parameter of `opt`, undefined = none) once for inf/NaN, writes nothing, and records them
  /// with `weights` for the step, which unscales inside. Same stage rules as unscale_.
  bool check_for_fused_(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                        std::vector<at::Tensor> weights);
  /// check_for_fused_ with the check made already, in parts (the overlapped-backward pipeline
  /// checks each bucket as it becomes ready): `found` (a 1-element fp32 CPU tensor, nonzero for
  /// inf/NaN) and `absmax` are what the check of `grads` gave. Same stage rules and record.
  bool record_fused_check_(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                           std::vector<at::Tensor> weights, at::Tensor found, AbsmaxList absmax);
  /// Clipping by the global 2-norm (scaler/clip.h), after this iteration's unscale or check of
  /// `opt` and before its step: the gradients are multiplied by clip_grad_norm_'s coefficient
  /// when the total exceeds max_norm (a fused check's by its step, with the inverse scale).
  /// `squares`: each defined gradient's squared_norm, made already. Returns the total norm of the
  /// true-sized gradients; NaN, clipping nothing, when inf/NaN was found (the step is skipped).
  /// Before the unscale or after the step: ScalerError(errc::protocol_misuse).
  double clip_grad_norm_(torch::optim::Optimizer& opt, double max_norm, float inv_scale,
                         const std::vector<double>* squares = nullptr);
  /// The overlapped-backward pipeline's record with ranks: the gradients were moved into the
  /// masters' grads (move_measured) and averaged bucket by bucket, found_inf and the size
  /// agreed in the same collectives. local_found: this rank's own; found and size: the agreed
  /// ones (no collective here), found_by the ranks that found it. The step reads the masters'
  /// grads and writes `weights`. Same stage rules as unscale_. Returns found.
  bool record_agreed_move_(torch::optim::Optimizer& opt, std::vector<at::Tensor> weights,
                           bool local_found, bool found, GradSize size, AbsmaxList absmax,
                           std::vector<std::int32_t> found_by = {});
  /// Whether `opt`'s fused step in this iteration wrote the weights recorded with its check.
  bool wrote_weights(const torch::optim::Optimizer& opt) const;
  /// After this iteration's move_and_unscale_ of `opt` (before its step): a fused step of it also
  /// writes `weights` (one per parameter, as ScaledStep::weights) in the same pass, and
  /// wrote_weights() says whether it did. Another stage: ScalerError(errc::protocol_misuse).
  void write_weights_in_step(const torch::optim::Optimizer& opt, std::vector<at::Tensor> weights);
  /// step: unscale_ if READY, then opt.step() unless inf/NaN was recorded. A fused optimizer
  /// (ampactor::optim) is checked instead of unscaled when READY and steps with the scale and
  /// found_inf, as torch's GradScaler steps fused optimizers; after unscale_ it sees scale 1.
  /// Refuses a second step() and an optimizer without gradients. A refused call changes nothing.
  /// `on_unscaled` hears of an unscale done here before opt.step() runs (which may throw).
  StepOutcome step(torch::optim::Optimizer& opt, float inv_scale,
                   const std::function<void(bool found_inf)>& on_unscaled = nullptr);
  /// How large `opt`'s gradients were at its unscale in this iteration (unknown before it).
  GradSize grad_size(const torch::optim::Optimizer& opt) const;

  OptState stage(const torch::optim::Optimizer& opt) const;
  /// nullopt before unscale_/step in this iteration. With ranks: the agreed value.
  std::optional<bool> found_inf(const torch::optim::Optimizer& opt) const;
  /// This rank's own found_inf (equal to found_inf without ranks).
  std::optional<bool> local_found_inf(const torch::optim::Optimizer& opt) const;
  /// With ranks: the ranks whose own check of `opt` found inf or NaN (empty without).
  std::vector<std::int32_t> found_by(const torch::optim::Optimizer& opt) const;
  /// Whether unscale_ recorded inf checks for `opt` (false when it had no gradients: torch then
  /// records none, and update() with nothing else raises "No inf checks ... prior to update").
  bool has_inf_checks(const torch::optim::Optimizer& opt) const;
  /// Optimizers whose inf checks are recorded, and whether any of them found inf/NaN.
  std::size_t recorded() const;
  /// The records of this iteration (until reset()), for the overflow report.
  const std::unordered_map<const torch::optim::Optimizer*, OptimizerRecord>& records() const {
    return records_;
  }
  bool any_found_inf() const;
  const std::shared_ptr<RankGroup>& ranks() const { return ranks_; }
  /// update(): every optimizer back to READY.
  void reset() { records_.clear(); }

 private:
  /// Unscales into a fresh record without touching records_ (so a refusal changes nothing).
  Unscaled unscale_grads(torch::optim::Optimizer& opt, float inv_scale) const;
  /// The same, reading only (a fused optimizer's check; fp16 grads allowed, as in torch).
  Unscaled check_grads(torch::optim::Optimizer& opt) const;
  /// Records the local found_inf and, with ranks, agrees found_inf and the size across them.
  void agree(OptimizerRecord& rec) const;
  /// rec's own found_inf and size, as the values the ranks agree on (agreement_values() of them).
  Agreement local_values(const OptimizerRecord& rec, std::vector<float>& v) const;
  /// Installs the agreed values in rec (`local`: what local_values gave).
  void apply_agreed(OptimizerRecord& rec, const std::vector<float>& v, Agreement local) const;

  bool allow_fp16_grads_;
  std::shared_ptr<RankGroup> ranks_;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerRecord> records_;
};

}  // namespace ampactor
