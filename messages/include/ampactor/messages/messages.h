// The typed messages between the trainer, the optimizer and the scale_keeper. Plain values only
// (no tensors): what decides the scale is small, and these types serialise, record and replay.
// Every message carries the iteration number k it belongs to.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ampactor/scaler/errors.h>
#include <ampactor/scaler/state_dict.h>

namespace ampactor {

using iteration_t = std::int64_t;
using optimizer_id = std::uint64_t;

/// How ScaleRequest{k} is answered. exact: once update k-1 is applied (the trajectory equals
/// synchronous torch). lagged: at once (RoundPipe), with one backoff per overflow event.
enum class ScalePolicy : std::uint8_t { exact, lagged };

/// trainer -> keeper: the scale for iteration k (creates the scale at the first request).
struct ScaleRequest {
  iteration_t k = 0;
};
/// keeper -> trainer.
struct ScaleReply {
  iteration_t k = 0;
  float scale = 0;
};

/// optimizer -> keeper, after the fused unscale + check of iteration k for one optimizer.
struct UnscaleDone {
  iteration_t k = 0;
  optimizer_id optimizer = 0;
  bool found_inf = false;
  float scale_used = 0;
};

/// optimizer -> trainer and subscribers: what became of one optimizer's step in iteration k.
struct StepResult {
  iteration_t k = 0;
  optimizer_id optimizer = 0;
  bool found_inf = false;
  bool skipped = false;
  float scale_used = 0;
};

/// trainer -> keeper, never waits: apply the update of iteration k once `expected_unscales`
/// UnscaleDone{k} have arrived, or set the scale to `new_scale` when `has_new_scale`.
struct UpdateScale {
  iteration_t k = 0;
  std::int32_t expected_unscales = 0;
  bool has_new_scale = false;
  double new_scale = 0;
};

/// UpdateScale::expected_unscales when the trainer cannot know the count (step jobs still
/// running): the optimizer actor tells it with IterationClosed{k}.
inline constexpr std::int32_t unscales_from_optimizer = -1;

/// optimizer -> keeper, after the last job of iteration k: `unscales` UnscaleDone{k} were sent
/// before this. abandoned: a job failed or was cancelled, so update k changes nothing (as in
/// torch, where the exception keeps update() from being called). Also sent, abandoned, as soon as
/// a job with counted_unscales fails short of them (the update then waits for no more).
struct IterationClosed {
  iteration_t k = 0;
  std::int32_t unscales = 0;
  bool abandoned = false;
};

/// trainer -> optimizer: iteration k gets no more jobs. report_unscales: send IterationClosed{k}
/// to the keeper (the trainer sent UpdateScale{k, unscales_from_optimizer}).
struct CloseIteration {
  iteration_t k = 0;
  bool report_unscales = false;
};

/// trainer -> optimizer: run `fn` on the optimizer thread as part of iteration k, with the scale
/// iteration k's gradients were made with (it travels with the job). Replies JobDone. Jobs run in
/// mailbox order. A job whose epoch is below the actor's cancel epoch is dropped unrun.
struct StepJob {
  iteration_t k = 0;
  float scale = 1;
  std::function<void()> fn;
  std::uint64_t epoch = 0;
  /// false: the trainer has already counted this iteration's unscales, so the job may step
  /// optimizers that are unscaled but may not unscale another one (it would come too late).
  bool may_unscale = true;
  /// With may_unscale false: the trainer counted this many unscales of this job in advance (a
  /// deferred grad move), so the job must make exactly that many. One that fails, is cancelled
  /// or ends with fewer tells the keeper at once (IterationClosed, abandoned) so that the update
  /// it waits for is not held up forever.
  std::int32_t counted_unscales = 0;
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

/// trainer -> keeper: read the parameters. up_to_date=true is answered after every update sent
/// before it is applied; false answers at once from the current state.
struct GetParams {
  iteration_t k = 0;
  bool up_to_date = false;
};

enum class Param : std::uint8_t { growth_factor, backoff_factor, growth_interval };

/// trainer -> keeper: set a parameter, applied in mailbox order (after earlier updates).
struct SetParam {
  iteration_t k = 0;
  Param which = Param::growth_factor;
  double value = 0;
};

/// A state_dict as a message: torch's five keys, or empty.
struct StateDictMsg {
  bool empty = true;
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  std::int64_t growth_interval = 0;
  std::int64_t growth_tracker = 0;
};
StateDictMsg to_message(const StateDict& sd);
/// Keeps exactly the keys a StateDictMsg has (ints stay ints).
StateDict from_message(const StateDictMsg& m);

/// trainer -> keeper: a consistent snapshot (pending updates applied first).
struct GetStateDict {
  iteration_t k = 0;
};
/// trainer -> keeper: load a state_dict, after earlier updates.
struct LoadStateDict {
  iteration_t k = 0;
  StateDictMsg state;
};

using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;

// ---- inspect: one free function per message ----
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleRequest& x) {
  return f(caf::meta::type_name("ScaleRequest"), x.k);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleReply& x) {
  return f(caf::meta::type_name("ScaleReply"), x.k, x.scale);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UnscaleDone& x) {
  return f(caf::meta::type_name("UnscaleDone"), x.k, x.optimizer, x.found_inf, x.scale_used);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("StepResult"), x.k, x.optimizer, x.found_inf, x.skipped,
           x.scale_used);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateScale& x) {
  return f(caf::meta::type_name("UpdateScale"), x.k, x.expected_unscales, x.has_new_scale,
           x.new_scale);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateApplied& x) {
  return f(caf::meta::type_name("UpdateApplied"), x.k, x.scale, x.growth_tracker, x.found_inf,
           x.backed_off, x.grew, x.abandoned);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleParams& x) {
  return f(caf::meta::type_name("ScaleParams"), x.applied_through, x.scale, x.growth_factor,
           x.backoff_factor, x.growth_interval, x.growth_tracker);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetParams& x) {
  return f(caf::meta::type_name("GetParams"), x.k, x.up_to_date);
}
// Param is an enum: CAF inspects enums itself.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetParam& x) {
  return f(caf::meta::type_name("SetParam"), x.k, x.which, x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StateDictMsg& x) {
  return f(caf::meta::type_name("StateDictMsg"), x.empty, x.scale, x.growth_factor,
           x.backoff_factor, x.growth_interval, x.growth_tracker);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetStateDict& x) {
  return f(caf::meta::type_name("GetStateDict"), x.k);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadStateDict& x) {
  return f(caf::meta::type_name("LoadStateDict"), x.k, x.state);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationClosed& x) {
  return f(caf::meta::type_name("IterationClosed"), x.k, x.unscales, x.abandoned);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CloseIteration& x) {
  return f(caf::meta::type_name("CloseIteration"), x.k, x.report_unscales);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobDone& x) {
  return f(caf::meta::type_name("JobDone"), x.k, x.unscales);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationDone& x) {
  return f(caf::meta::type_name("IterationDone"), x.k, x.steps, x.failed, x.error_code,
           x.error_text, x.cancelled_jobs);
}
// StepJob carries a closure: it travels in-process only (see the end of this file).

// ---- errors across actor boundaries: errc as a CAF error category ----
/// The category atom under which errc values travel as caf::error.
constexpr caf::atom_value error_category = caf::atom("ampactor");
caf::error make_error(errc code);
caf::error make_error(errc code, const std::string& what);
/// The ScalerError a caf::error stands for (torch's text where torch has one).
ScalerError to_exception(const caf::error& e);

}  // namespace ampactor

// A closure cannot be serialised; within one process it is moved, never copied across a wire.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ampactor::StepJob)
