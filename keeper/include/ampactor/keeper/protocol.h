// The typed messages between the trainer, the optimizer and the scale_keeper, as plain values: no
// CAF, no tensors. What decides the scale is small, and these types serialise, record and replay.
// Each kind of request is its own type: no flag or sentinel changes a message's meaning.
// <ampactor/messages/messages.h> adds what CAF needs (inspect, atoms, error glue).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ampactor/core/errors.h>
#include <ampactor/core/overflow.h>
#include <ampactor/core/state_dict.h>

namespace ampactor {

using iteration_t = std::int64_t;
using optimizer_id = std::uint64_t;

/// How ScaleRequest{k} is answered. exact: once update k-1 is applied (the trajectory equals
/// synchronous torch). lagged: at once (RoundPipe), with one backoff per overflow event.
enum class ScalePolicy : std::uint8_t { exact, lagged };

/// trainer -> keeper: the scale for iteration k (creates the scale at the first request). Under
/// the exact policy every iteration before k, from the first one requested on, must have sent
/// its update (UpdateScale, UpdateWhenClosed or SetScale) first, or the reply is an error
/// (errc::protocol_misuse): a forgotten update is reported, never lost.
struct ScaleRequest {
  iteration_t k = 0;
};
/// The scale-collapse guard's view of one scale (GradScalerOptions::collapse_backoffs,
/// collapse_below): the backoffs in a row that led to it, and whether that many backoffs or a
/// scale that low trips the guard. The guard warns (or raises) once; this says it every time.
struct ScaleGuard {
  std::int64_t backoffs_in_row = 0;
  bool collapsing = false;
  bool operator==(const ScaleGuard& o) const {
    return backoffs_in_row == o.backoffs_in_row && collapsing == o.collapsing;
  }
};

/// keeper -> trainer.
struct ScaleReply {
  iteration_t k = 0;
  float scale = 0;
  ScaleGuard guard = {};  // of this scale
};

/// optimizer -> keeper, after the fused unscale + check of iteration k for one optimizer.
struct UnscaleDone {
  iteration_t k = 0;
  optimizer_id optimizer = 0;
  bool found_inf = false;
  float scale_used = 0;
  /// How large the gradients were, measured in the same pass: the largest finite |gradient| as
  /// made at scale_used, and the largest finite value of that gradient's dtype (of the dtype
  /// nearest to overflow, when an optimizer's gradients mix dtypes). dtype_max 0: not measured.
  /// The keeper does not use them; traces record them, and what-if replays predict from them.
  double grad_max = 0;
  double dtype_max = 0;
  /// Data parallel: this rank's own found_inf; found_inf and grad_max are then the ranks' agreed
  /// (largest) values. Without ranks it equals found_inf.
  bool local_found_inf = false;
  /// Which gradients held inf or NaN (where the path attributes them; empty when clean), and,
  /// with data parallel, the ranks whose own check found one. The keeper does not use them;
  /// traces record them.
  std::vector<OverflowTensor> overflow = {};
  std::vector<std::int32_t> found_by = {};
};

/// optimizer -> trainer and subscribers: what became of one optimizer's step in iteration k.
struct StepResult {
  iteration_t k = 0;
  optimizer_id optimizer = 0;
  bool found_inf = false;
  bool skipped = false;
  float scale_used = 0;
  ScaleGuard guard = {};  // of scale_used: collapsing says the scale-collapse guard had tripped
};

/// trainer -> keeper, never waits: apply the update rule to iteration k once `unscales`
/// UnscaleDone{k} have arrived (the trainer counted them), or once an abandoned
/// IterationClosed{k} says they never will.
struct UpdateScale {
  iteration_t k = 0;
  std::int32_t unscales = 0;
};

/// trainer -> keeper, never waits: apply the update rule to iteration k once the optimizer's
/// IterationClosed{k} says how many UnscaleDone{k} to wait for (step jobs still running, so the
/// trainer cannot count them).
struct UpdateWhenClosed {
  iteration_t k = 0;
};

/// trainer -> keeper, never waits: iteration k's update is torch's update(new_scale): the scale
/// becomes new_scale (checked by the sender), the growth tracker stays.
struct SetScale {
  iteration_t k = 0;
  double new_scale = 0;
  /// The trainer queued step jobs in k: apply once the optimizer has closed k (IterationClosed),
  /// and not at all if k was abandoned (a job failed or was cancelled), as for any update.
  bool after_jobs = false;
};

/// optimizer -> keeper, after the last job of iteration k: `unscales` UnscaleDone{k} were sent
/// before this. abandoned: a job failed or was cancelled, so update k changes nothing (as in
/// torch, where the exception keeps update() from being called). Also sent, abandoned, as soon as
/// a job with a counted number of unscales fails short of them (the update then waits for no
/// more).
struct IterationClosed {
  iteration_t k = 0;
  std::int32_t unscales = 0;
  bool abandoned = false;
};

/// trainer -> optimizer: iteration k gets no more jobs. report_unscales: send IterationClosed{k}
/// to the keeper (the trainer sent UpdateWhenClosed{k}).
struct CloseIteration {
  iteration_t k = 0;
  bool report_unscales = false;
  /// With report_unscales: an iteration without any unscale fails with torch's "No inf checks
  /// were recorded prior to update." (false for update(new_scale), which needs none).
  bool inf_checks_required = true;
};

/// What a step job may unscale, fixed when the trainer queues it. Built by its named
/// constructors only, so no illegal combination exists.
class UnscalePermit {
 public:
  enum class Kind : std::uint8_t { any, none, exactly };
  /// The job may unscale any optimizer: the optimizer counts its unscales (UpdateWhenClosed).
  static UnscalePermit any() { return UnscalePermit(Kind::any, 0); }
  /// The trainer already counted this iteration's unscales: the job may step optimizers unscaled
  /// before it but may not unscale another one (it would come too late).
  static UnscalePermit none() { return UnscalePermit(Kind::none, 0); }
  /// The trainer counted n unscales of this job in advance (a deferred grad move): it must make
  /// exactly n. One that fails, is cancelled or ends with fewer tells the keeper at once
  /// (IterationClosed, abandoned), so the update it waits for is not held up. n >= 1.
  static UnscalePermit exactly(std::int32_t n);

  Kind kind() const { return kind_; }
  /// The unscales counted in advance (0 unless exactly()).
  std::int32_t counted() const { return count_; }
  bool operator==(const UnscalePermit& o) const { return kind_ == o.kind_ && count_ == o.count_; }

 private:
  UnscalePermit(Kind kind, std::int32_t count) : kind_(kind), count_(count) {}
  Kind kind_;
  std::int32_t count_;
};

/// trainer -> optimizer: run `fn` on the optimizer thread as part of iteration k, with the scale
/// iteration k's gradients were made with (it travels with the job). Replies JobDone. Jobs run in
/// mailbox order. A job whose epoch is below the actor's cancel epoch is dropped unrun.
struct StepJob {
  iteration_t k = 0;
  float scale = 1;
  std::function<void()> fn;
  std::uint64_t epoch = 0;
  UnscalePermit permit = UnscalePermit::any();
  ScaleGuard guard = {};  // of scale (for the StepResults)
};

/// optimizer -> trainer: a job ran to the end. unscales: how many UnscaleDone{k} it sent.
struct JobDone {
  iteration_t k = 0;
  std::int32_t unscales = 0;
};

/// optimizer -> trainer and subscribers, when CloseIteration{k} is processed: every step of
/// iteration k, and whether a job failed (its error, as code and text) or was cancelled.
struct IterationDone {
  iteration_t k = 0;
  std::vector<StepResult> steps;
  bool failed = false;
  errc error_code = errc::step_failed;
  std::string error_text;
  std::int32_t cancelled_jobs = 0;
  /// The gradients that held inf or NaN, named (GradScaler::name_parameters), where an unscale
  /// found one and its path attributes (empty otherwise).
  std::vector<OverflowTensor> overflow = {};
  /// Data parallel: the ranks whose own check found the overflow (empty without ranks).
  std::vector<std::int32_t> overflow_ranks = {};
  /// Some optimizer skipped its step.
  bool skipped() const {
    for (const auto& s : steps)
      if (s.skipped) return true;
    return false;
  }
};

/// keeper -> subscribers: an update was applied.
struct UpdateApplied {
  iteration_t k = 0;
  float scale = 0;
  std::int64_t growth_tracker = 0;
  bool found_inf = false;
  bool backed_off = false;
  bool grew = false;
  /// The iteration was abandoned (a job failed or was cancelled, or no inf checks were
  /// recorded): nothing changed.
  bool abandoned = false;
  /// The update raised (the deepspeed rule at its minimum, errc::scale_at_minimum): nothing
  /// changed, and the trainer's next scale() throws until update(new_scale) or a load.
  bool halted = false;
  /// The scale after this update is below 1: the loss is scaled down, not up (torch's rule has
  /// no floor, pytorch issue #99640; set a min_scale to keep it from there).
  bool below_one = false;
  ScaleGuard guard = {};  // of the scale after this update
};

/// The keeper's parameters, as the getters report them.
struct ScaleParams {
  iteration_t applied_through = -1;  // last iteration whose update is applied
  double scale = 0;                  // torch's get_scale() value
  double growth_factor = 0;
  double backoff_factor = 0;
  std::int64_t growth_interval = 0;
  std::int64_t growth_tracker = 0;
};

// ---- monitor queries: any actor may send them; none needs an iteration number ----

/// -> keeper: read the parameters. up_to_date=true is answered after every update sent before it
/// is applied; false answers at once from the current state.
struct GetParams {
  bool up_to_date = false;
};

/// -> keeper: set a parameter (checked), applied in mailbox order after earlier updates. Each
/// replies the parameters after it, or the refusal (the state unchanged).
struct SetGrowthFactor {
  double value = 0;
};
struct SetBackoffFactor {
  double value = 0;
};
struct SetGrowthInterval {
  std::int64_t value = 0;
};

/// A state_dict as a message: torch's five keys, or empty.
struct StateDictMsg {
  bool empty = true;
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  std::int64_t growth_interval = 0;
  std::int64_t growth_tracker = 0;
  /// The rules with hysteresis add "_hysteresis_tracker" to the state_dict.
  bool has_hysteresis_tracker = false;
  std::int64_t hysteresis_tracker = 0;
};
StateDictMsg to_message(const StateDict& sd);
/// Keeps exactly the keys a StateDictMsg has (ints stay ints).
StateDict from_message(const StateDictMsg& m);

/// -> keeper: a consistent snapshot (pending updates applied first).
struct GetStateDict {};
/// -> keeper: load a state_dict, after earlier updates. Replies the parameters, or the refusal.
struct LoadStateDict {
  StateDictMsg state;
};

}  // namespace ampactor
