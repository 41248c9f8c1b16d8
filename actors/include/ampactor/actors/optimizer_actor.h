// The optimizer actor: runs step jobs in mailbox order on its own thread. Inside a job the thread
// is the optimizer thread: JobContext::current() gives the iteration, the scale the job came
// with, and unscale_/step that report to the scale_keeper and to subscribers.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ampactor/actors/scale_keeper.h>
#include <ampactor/core/arg.h>
#include <ampactor/core/options.h>
#include <ampactor/messages/messages.h>
#include <ampactor/scaler/overflow.h>
#include <ampactor/scaler/step_tracker.h>

namespace ampactor {

/// The optimizer actor's protocol. StepJob replies JobDone, or an error: the job's exception
/// (errc::step_failed unless it threw a ScalerError) or errc::cancelled. A subscriber gets every
/// IterationDone and, unless it subscribed with steps=false, every StepResult as it happens;
/// subscribing again changes only the steps choice, and unsubscribe stops both.
using optimizer_actor = caf::typed_actor<caf::replies_to<StepJob>::with<JobDone>,              //
                                         caf::reacts_to<CloseIteration>,                       //
                                         caf::reacts_to<subscribe_atom, trainer_actor>,        //
                                         caf::reacts_to<subscribe_atom, trainer_actor, bool>,  //
                                         caf::reacts_to<unsubscribe_atom, trainer_actor>>;

/// The identity an optimizer has in messages.
optimizer_id optimizer_id_of(const torch::optim::Optimizer& opt);

namespace internal {
class PipelineJob;
}  // namespace internal

/// The job running on this thread. Every call acts for the job's iteration with the job's scale.
class JobContext {
 public:
  /// The job running on the calling thread, or nullptr outside step jobs.
  static JobContext* current() noexcept;

  iteration_t iteration() const { return k_; }
  /// The scale this iteration's gradients were made with.
  float scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  /// The optimizer actor running the job (tells scalers apart).
  caf::actor_id runner() const { return runner_; }

  /// torch's unscale_ with this job's scale; reports UnscaleDone. Returns whether inf/NaN was
  /// found (false when disabled).
  bool unscale_(torch::optim::Optimizer& opt);
  /// torch's step: unscale_ if not done, then opt.step() unless inf/NaN; publishes StepResult.
  /// Disabled: opt.step(closure). Enabled with a closure: torch's error.
  StepOutcome step(torch::optim::Optimizer& opt,
                   const std::function<at::Tensor()>& closure = nullptr);
  /// Clipping by the global 2-norm after this job's unscale or check and before the step
  /// (StepTracker::clip_grad_norm_, with this job's scale). With the scaler disabled, the
  /// masters' grads are clipped as torch's clip_grad_norm_ would. Returns the total norm (NaN
  /// when the step is skipped).
  double clip_grad_norm_(torch::optim::Optimizer& opt, double max_norm,
                         const std::vector<double>* squares = nullptr);
  OptState stage(const torch::optim::Optimizer& opt) const;
  std::optional<bool> found_inf(const torch::optim::Optimizer& opt) const;
  /// UnscaleDone messages sent by this job so far.
  std::int32_t unscales() const { return unscales_; }

  JobContext(const JobContext&) = delete;
  JobContext& operator=(const JobContext&) = delete;

 protected:
  /// permit: what the job may unscale (UnscalePermit).
  JobContext(iteration_t k, float scale, ScaleGuard guard, bool enabled, UnscalePermit permit,
             caf::actor_id runner, StepTracker& tracker);
  virtual ~JobContext();
  /// found_inf: agreed across the ranks, if any; local_found_inf: this rank's own. size: how large
  /// the gradients were (StepTracker::grad_size); found_by: the ranks that found it.
  virtual void report_unscale(optimizer_id opt, bool found_inf, bool local_found_inf,
                              const GradSize& size, std::vector<std::int32_t> found_by) = 0;
  virtual void report_step(const StepResult& r) = 0;
  /// An unscale or check of `opt` found inf or NaN (just before report_unscale), while its
  /// gradients are as checked: where the overflow report is made. No-op by default.
  virtual void found_overflow(const torch::optim::Optimizer& opt) { (void)opt; }

 private:
  // The pipeline's calls (ampactor::pipeline, through internal::PipelineJob): none is a user's.
  friend class internal::PipelineJob;
  /// The pipeline's unscale: model grads moved into the masters' grads (fp32), unscaled with
  /// this job's scale and checked in one pass; recorded and reported as unscale_ is. adopt and
  /// reduce: see StepTracker::move_and_unscale_.
  bool move_and_unscale_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                         std::vector<at::Tensor>& masters, bool adopt = false,
                         const GradReduce& reduce = {});
  /// The pipeline's check for a fused optimizer (ampactor::optim): model grads read once for
  /// inf/NaN and reported as unscale_ is; the step then reads them and writes `weights` (see
  /// StepTracker::check_for_fused_). With the scaler disabled the grads are moved into the
  /// masters' grads instead, and the step is a plain one.
  bool check_for_fused_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                        std::vector<at::Tensor>& masters, std::vector<at::Tensor> weights);
  /// check_for_fused_ with the check made already, in parts (StepTracker::record_fused_check_):
  /// the overlapped-backward pipeline's buckets, each checked as it became ready. Enabled only.
  bool record_fused_check_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                           std::vector<at::Tensor> weights, at::Tensor found, AbsmaxList absmax);
  /// StepTracker::record_agreed_move_ for this job (the overlapped backward with ranks), reported
  /// as unscale_ is. Enabled only.
  bool record_agreed_move_(torch::optim::Optimizer& opt, std::vector<at::Tensor> weights,
                           bool local_found, bool found, GradSize size, AbsmaxList absmax,
                           std::vector<std::int32_t> found_by = {});
  /// Whether `opt`'s fused step wrote the weights handed to check_for_fused_ (or to
  /// write_weights_in_step).
  bool wrote_weights(const torch::optim::Optimizer& opt) const;
  /// StepTracker::write_weights_in_step after this job's move_and_unscale_; nothing with the
  /// scaler disabled (the step is a plain one).
  void write_weights_in_step(const torch::optim::Optimizer& opt, std::vector<at::Tensor> weights);

  void refuse_late_unscale(const torch::optim::Optimizer& opt) const;
  /// found_overflow (when found), then report_unscale.
  void report(const torch::optim::Optimizer& opt, bool found, bool local_found);

  iteration_t k_;
  float scale_;
  ScaleGuard guard_;
  bool enabled_;
  UnscalePermit permit_;
  caf::actor_id runner_;
  StepTracker& tracker_;
  std::int32_t unscales_ = 0;
  std::vector<const torch::optim::Optimizer*> moved_;  // optimizers whose grads this job moved
  JobContext* outer_;
};

/// Named options: OptimizerActorOptions().detached(false). Every value of either is valid.
class OptimizerActorOptions {
 public:
  using Epoch = std::shared_ptr<const std::atomic<std::uint64_t>>;

  /// Its own thread (caf::detached). Tests under CAF's deterministic scheduler turn this off.
  AMPACTOR_ARG_ANY(bool, detached, true);
  /// Jobs whose epoch is below this value are dropped unrun (cancel()). Optional (nullptr: none).
  AMPACTOR_ARG_ANY(Epoch, cancel_epoch, nullptr);
  /// The parameters' names in IterationDone's overflow report, read on the optimizer's thread
  /// (change them there: a job). nullptr: each is "param <index>".
  AMPACTOR_ARG_ANY(std::shared_ptr<ParameterNames>, names, nullptr);
};

/// Spawns an optimizer actor reporting to `keeper`. opts.enabled() and opts.allow_fp16_grads()
/// apply.
optimizer_actor spawn_optimizer_actor(caf::actor_system& sys, scale_keeper_actor keeper,
                                      const GradScalerOptions& opts,
                                      OptimizerActorOptions options = {});

/// A keeper and an optimizer actor wired together: everything a trainer needs. With
/// options.detached() (the default) both get threads of their own.
struct ScalerActors {
  scale_keeper_actor keeper;
  optimizer_actor optimizer;
};
/// `who` hears every StepResult and IterationDone (the optimizer) and every UpdateApplied (the
/// keeper) from now on; unsubscribe stops both. E.g. subscribe(scaler.actors(), monitor).
void subscribe(const ScalerActors& actors, const trainer_actor& who);
void unsubscribe(const ScalerActors& actors, const trainer_actor& who);

ScalerActors spawn_scaler_actors(caf::actor_system& sys, const GradScalerOptions& opts,
                                 ScalePolicy policy = ScalePolicy::exact,
                                 OptimizerActorOptions options = {});

}  // namespace ampactor
