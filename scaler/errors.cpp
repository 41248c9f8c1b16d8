#include <ampactor/scaler/errors.h>

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

const char* to_string(errc code) {
  switch (code) {
    case errc::unscale_twice:
      return "unscale_twice";
    case errc::unscale_after_step:
      return "unscale_after_step";
    case errc::step_twice:
      return "step_twice";
    case errc::closure_unsupported:
      return "closure_unsupported";
    case errc::empty_state_dict:
      return "empty_state_dict";
    case errc::fp16_grads:
      return "fp16_grads";
    case errc::bad_outputs:
      return "bad_outputs";
    case errc::no_inf_checks_for_optimizer:
      return "no_inf_checks_for_optimizer";
    case errc::no_inf_checks_before_update:
      return "no_inf_checks_before_update";
    case errc::bad_new_scale:
      return "bad_new_scale";
    case errc::scale_not_initialized:
      return "scale_not_initialized";
    case errc::bad_growth_factor:
      return "bad_growth_factor";
    case errc::bad_backoff_factor:
      return "bad_backoff_factor";
    case errc::bad_growth_interval:
      return "bad_growth_interval";
    case errc::bad_init_scale:
      return "bad_init_scale";
    case errc::bad_state_dict:
      return "bad_state_dict";
    case errc::invalid_gradients:
      return "invalid_gradients";
    case errc::update_off_main_thread:
      return "update_off_main_thread";
    case errc::step_failed:
      return "step_failed";
    case errc::wrong_thread:
      return "wrong_thread";
    case errc::cancelled:
      return "cancelled";
    case errc::iteration_open:
      return "iteration_open";
    case errc::protocol_misuse:
      return "protocol_misuse";
    case errc::bad_option:
      return "bad_option";
    case errc::bad_parameters:
      return "bad_parameters";
    case errc::bad_checkpoint:
      return "bad_checkpoint";
    case errc::bad_rule:
      return "bad_rule";
    case errc::scale_at_minimum:
      return "scale_at_minimum";
    case errc::rank_failed:
      return "rank_failed";
  }
  return "unknown";
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
