// Every way a scaler call can be refused, with torch.amp.GradScaler's texts where torch has one.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ampactor {

/// Error codes shared by the thread-free scaler, the kernels' callers and the actors.
/// Zero is reserved for "no error" (as CAF's error codes require).
enum class errc : std::uint8_t {
  /// unscale_() twice for one optimizer within an iteration (RuntimeError in torch).
  unscale_twice = 1,
  /// unscale_() after step() within an iteration (RuntimeError).
  unscale_after_step,
  /// step() twice for one optimizer within an iteration (RuntimeError).
  step_twice,
  /// step() with a closure while scaling is enabled (RuntimeError).
  closure_unsupported,
  /// load_state_dict() with an empty dict, e.g. from a disabled scaler (RuntimeError).
  empty_state_dict,
  /// fp16 gradients given to unscale_ without allow_fp16_grads (ValueError).
  fp16_grads,
  /// scale() given something that is not a tensor (ValueError).
  bad_outputs,
  /// step() on an optimizer that has no gradients (AssertionError).
  no_inf_checks_for_optimizer,
  /// update() without new_scale and without any unscale_/step since the last update
  /// (AssertionError).
  no_inf_checks_before_update,
  /// update(new_scale) with a tensor that is not 1-element, float, without grad, or a bad value.
  bad_new_scale,
  /// unscale_/step/update before the first scale() (AssertionError).
  scale_not_initialized,
  /// growth_factor not > 1.
  bad_growth_factor,
  /// backoff_factor not in (0, 1).
  bad_backoff_factor,
  /// growth_interval not in [1, 2^31 - 1].
  bad_growth_interval,
  /// init_scale not finite and > 0.
  bad_init_scale,
  /// load_state_dict() with a missing key, a value of the wrong type or an invalid value.
  bad_state_dict,
  /// The kernels refused the gradients (dtype, device, shape, overlap).
  invalid_gradients,
  /// update() called off the main thread.
  update_off_main_thread,
  /// The user's step function threw on the optimizer thread (rethrown on the main thread).
  step_failed,
  /// A main-thread-only call (state_dict, setters, up_to_date getters, sync...) made inside a step
  /// job or from a thread other than the one that owns the scaler.
  wrong_thread,
  /// The step job was dropped by cancel() before it started.
  cancelled,
  /// A result was awaited for an iteration that update() has not closed yet (it would never come).
  iteration_open,
  /// A message broke the protocol: e.g. a ScaleRequest{k} whose earlier iteration's update was
  /// never sent, or a step job that unscales more optimizers than it was allowed to.
  protocol_misuse,
  /// A setter of the options (AsyncOptimizerOptions, SubmitOptions...; GradScalerOptions' use the
  /// bad_* codes above) or a call's argument was given a value it cannot hold.
  bad_option,
  /// AsyncOptimizer given model parameters it cannot keep masters of (undefined, not floating
  /// point, or spread over devices when offloading), or an optimizer over anything but its
  /// masters.
  bad_parameters,
  /// A checkpoint that cannot be written, or read back: missing, truncated, corrupt, or holding
  /// state that does not fit what it is loaded into (other parameters, shapes or options).
  bad_checkpoint,
  /// An update rule's options that its kind cannot take (options.h, rule_options.cpp): a min_scale
  /// or max_scale out of range, hysteresis on a rule without it, a factor a peer fixes.
  bad_rule,
  /// The deepspeed rule with raise_at_min_scale: an overflow with the scale already at min_scale
  /// (DeepSpeed raises; nothing changed).
  scale_at_minimum,
  /// Data parallel: another rank died, failed in its step job or cannot be reached, or the
  /// collective timed out; the text names the rank where it is known.
  rank_failed,
  /// A trace that cannot be written (the file cannot be created) or read (missing, malformed, or
  /// from a newer version); TraceError carries the line.
  bad_trace,
  /// The scale-collapse guard: with raise_on_collapse, the scale backed off collapse_backoffs
  /// times in a row or fell below collapse_below; always, an update that would take the scale
  /// below smallest_scale(), which no checkpoint can hold. Nothing changed.
  scale_collapsed,
};

/// The Python exception torch raises for a code: "RuntimeError", "ValueError" or "AssertionError".
const char* python_kind(errc code);

/// A short stable name for a code, e.g. "unscale_twice".
const char* to_string(errc code);

/// Thrown by every scaler call that refuses its input; what() is torch's text where torch has one.
/// A refused call changes no state.
class ScalerError : public std::runtime_error {
 public:
  ScalerError(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  errc code() const noexcept { return code_; }

 private:
  errc code_;
};

/// torch's texts, but for the last two.
namespace texts {
inline constexpr const char* unscale_twice =
    "unscale_() has already been called on this optimizer since the last update().";
inline constexpr const char* unscale_after_step = "unscale_() is being called after step().";
inline constexpr const char* step_twice = "step() has already been called since the last update().";
inline constexpr const char* closure_unsupported =
    "Closure use is not currently supported if GradScaler is enabled.";
inline constexpr const char* empty_state_dict =
    "The source state dict is empty, possibly because it was saved from a disabled instance of "
    "GradScaler.";
inline constexpr const char* fp16_grads = "Attempting to unscale FP16 gradients.";
inline constexpr const char* bad_outputs = "outputs must be a Tensor or an iterable of Tensors";
inline constexpr const char* no_inf_checks_for_optimizer =
    "No inf checks were recorded for this optimizer.";
inline constexpr const char* no_inf_checks_before_update =
    "No inf checks were recorded prior to update.";
inline constexpr const char* bad_new_scale =
    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with "
    "requires_grad=False.";
inline constexpr const char* growth_factor = "The growth factor must be > 1.0.";
/// c10's text when a double does not fit a float (torch.full, fill_, copy_ into the scale).
inline constexpr const char* float_overflow =
    "value cannot be converted to type float without overflow";
inline constexpr const char* backoff_factor = "The backoff factor must be < 1.0.";
/// DeepSpeed's text when its scale cannot back off below its minimum.
inline constexpr const char* scale_at_minimum =
    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";
// ampactor's own (torch has no thread rule and no step jobs), in torch's style.
inline constexpr const char* update_off_main_thread =
    "GradScaler.update() must be called from the main thread.";
inline constexpr const char* cancelled = "The step job was cancelled before it started.";
}  // namespace texts

/// A double as the refusals' texts show it (17 significant digits: the value itself).
std::string show_value(double v);

/// torch's text for a call made before the first scale(), e.g. scale_not_initialized_text("step").
std::string scale_not_initialized_text(const std::string& funcname);

}  // namespace ampactor
