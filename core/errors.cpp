#include <ampactor/core/errors.h>

#include <cstddef>
#include <iterator>
#include <sstream>

namespace ampactor {

const char* python_kind(errc code) {
  switch (code) {
    case errc::fp16_grads:
    case errc::bad_outputs:
      return "ValueError";
    case errc::no_inf_checks_for_optimizer:
    case errc::no_inf_checks_before_update:
    case errc::bad_new_scale:
    case errc::scale_not_initialized:
    case errc::bad_growth_factor:
    case errc::bad_backoff_factor:
      return "AssertionError";
    default:
      return "RuntimeError";
  }
}

namespace {

struct CodeName {
  errc code;
  const char* name;
};
// A code's name is its enumerator's; the table is in the enum's order (checked below), so that a
// code indexes it.
#define AMPACTOR_ERRC_NAME(code) \
  { errc::code, #code }
constexpr CodeName kNames[] = {AMPACTOR_ERRC_NAME(unscale_twice),
                               AMPACTOR_ERRC_NAME(unscale_after_step),
                               AMPACTOR_ERRC_NAME(step_twice),
                               AMPACTOR_ERRC_NAME(closure_unsupported),
                               AMPACTOR_ERRC_NAME(empty_state_dict),
                               AMPACTOR_ERRC_NAME(fp16_grads),
                               AMPACTOR_ERRC_NAME(bad_outputs),
                               AMPACTOR_ERRC_NAME(no_inf_checks_for_optimizer),
                               AMPACTOR_ERRC_NAME(no_inf_checks_before_update),
                               AMPACTOR_ERRC_NAME(bad_new_scale),
                               AMPACTOR_ERRC_NAME(scale_not_initialized),
                               AMPACTOR_ERRC_NAME(bad_growth_factor),
                               AMPACTOR_ERRC_NAME(bad_backoff_factor),
                               AMPACTOR_ERRC_NAME(bad_growth_interval),
                               AMPACTOR_ERRC_NAME(bad_init_scale),
                               AMPACTOR_ERRC_NAME(bad_state_dict),
                               AMPACTOR_ERRC_NAME(invalid_gradients),
                               AMPACTOR_ERRC_NAME(update_off_main_thread),
                               AMPACTOR_ERRC_NAME(step_failed),
                               AMPACTOR_ERRC_NAME(wrong_thread),
                               AMPACTOR_ERRC_NAME(cancelled),
                               AMPACTOR_ERRC_NAME(iteration_open),
                               AMPACTOR_ERRC_NAME(protocol_misuse),
                               AMPACTOR_ERRC_NAME(bad_option),
                               AMPACTOR_ERRC_NAME(bad_parameters),
                               AMPACTOR_ERRC_NAME(bad_checkpoint),
                               AMPACTOR_ERRC_NAME(bad_rule),
                               AMPACTOR_ERRC_NAME(scale_at_minimum),
                               AMPACTOR_ERRC_NAME(rank_failed),
                               AMPACTOR_ERRC_NAME(bad_trace),
                               AMPACTOR_ERRC_NAME(scale_collapsed)};
#undef AMPACTOR_ERRC_NAME

constexpr auto kFirst = static_cast<std::size_t>(errc::unscale_twice);
constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < std::size(kNames); ++i)
    if (static_cast<std::size_t>(kNames[i].code) != kFirst + i) return false;
  return true;
}
static_assert(in_enum_order(), "kNames must list the codes in the enum's order");
// errc has no count of its codes: a code added after scale_collapsed must be added above, and here.
static_assert(kNames[std::size(kNames) - 1].code == errc::scale_collapsed,
              "kNames must end at the last code");

}  // namespace

const char* to_string(errc code) {
  const auto i = static_cast<std::size_t>(code);
  return i >= kFirst && i - kFirst < std::size(kNames) ? kNames[i - kFirst].name : "unknown";
}

std::string show_value(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

std::string scale_not_initialized_text(const std::string& funcname) {
  return "Attempted " + funcname +
         " but _scale is None.  This may indicate your script did not use scaler.scale(loss or "
         "outputs) earlier in the iteration.";
}

}  // namespace ampactor
