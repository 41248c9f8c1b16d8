// What CAF needs of the protocol (<ampactor/keeper/protocol.h>, plain values): an inspect() per
// message, the atoms, the trainer interface, and errc as a CAF error category.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <string>

#include <ampactor/keeper/protocol.h>

namespace ampactor {

using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
using unsubscribe_atom = caf::atom_constant<caf::atom("unsubscrib")>;

/// What a trainer or monitor hears when it subscribes: from the optimizer every StepResult as it
/// happens and one IterationDone per closed iteration, from the keeper one UpdateApplied per
/// update. A user's own event-based trainer implements this and drives iterations with
/// ScaleRequest, StepJob, the updates and CloseIteration alone.
using trainer_actor = caf::typed_actor<caf::reacts_to<StepResult>,     //
                                       caf::reacts_to<IterationDone>,  //
                                       caf::reacts_to<UpdateApplied>>;

// ---- inspect: one free function per message ----
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleGuard& x) {
  return f(caf::meta::type_name("ScaleGuard"), x.backoffs_in_row, x.collapsing);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleRequest& x) {
  return f(caf::meta::type_name("ScaleRequest"), x.k);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleReply& x) {
  return f(caf::meta::type_name("ScaleReply"), x.k, x.scale, x.guard);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UnscaleDone& x) {
  return f(caf::meta::type_name("UnscaleDone"), x.k, x.optimizer, x.found_inf, x.scale_used,
           x.grad_max, x.dtype_max, x.local_found_inf, x.overflow, x.found_by);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("StepResult"), x.k, x.optimizer, x.found_inf, x.skipped,
           x.scale_used, x.guard);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateScale& x) {
  return f(caf::meta::type_name("UpdateScale"), x.k, x.unscales);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWhenClosed& x) {
  return f(caf::meta::type_name("UpdateWhenClosed"), x.k);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetScale& x) {
  return f(caf::meta::type_name("SetScale"), x.k, x.new_scale, x.after_jobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateApplied& x) {
  return f(caf::meta::type_name("UpdateApplied"), x.k, x.scale, x.growth_tracker, x.found_inf,
           x.backed_off, x.grew, x.abandoned, x.halted, x.below_one, x.guard);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleParams& x) {
  return f(caf::meta::type_name("ScaleParams"), x.applied_through, x.scale, x.growth_factor,
           x.backoff_factor, x.growth_interval, x.growth_tracker);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetParams& x) {
  return f(caf::meta::type_name("GetParams"), x.up_to_date);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetGrowthFactor& x) {
  return f(caf::meta::type_name("SetGrowthFactor"), x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetBackoffFactor& x) {
  return f(caf::meta::type_name("SetBackoffFactor"), x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetGrowthInterval& x) {
  return f(caf::meta::type_name("SetGrowthInterval"), x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StateDictMsg& x) {
  return f(caf::meta::type_name("StateDictMsg"), x.empty, x.scale, x.growth_factor,
           x.backoff_factor, x.growth_interval, x.growth_tracker, x.has_hysteresis_tracker,
           x.hysteresis_tracker);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetStateDict&) {
  return f(caf::meta::type_name("GetStateDict"));
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadStateDict& x) {
  return f(caf::meta::type_name("LoadStateDict"), x.state);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationClosed& x) {
  return f(caf::meta::type_name("IterationClosed"), x.k, x.unscales, x.abandoned);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CloseIteration& x) {
  return f(caf::meta::type_name("CloseIteration"), x.k, x.report_unscales, x.inf_checks_required);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobDone& x) {
  return f(caf::meta::type_name("JobDone"), x.k, x.unscales);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, OverflowTensor& x) {
  return f(caf::meta::type_name("OverflowTensor"), x.name, x.index, x.inf, x.nan, x.neighbours_max);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationDone& x) {
  return f(caf::meta::type_name("IterationDone"), x.k, x.steps, x.failed, x.error_code,
           x.error_text, x.cancelled_jobs, x.overflow, x.overflow_ranks);
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
