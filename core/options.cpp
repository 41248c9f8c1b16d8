#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace ampactor {

void check_growth_factor(double v, bool torch_text) {
  // `!(v > 1)` also refuses NaN.
  if (!(v > 1.0) || std::isinf(v))
    throw ScalerError(errc::bad_growth_factor, torch_text ? std::string(texts::growth_factor)
                                                          : std::string(texts::growth_factor) +
                                                                " Got " + show_value(v) + ".");
}

void check_backoff_factor(double v, bool torch_text) {
  if (!(v < 1.0))
    throw ScalerError(errc::bad_backoff_factor, torch_text ? std::string(texts::backoff_factor)
                                                           : std::string(texts::backoff_factor) +
                                                                 " Got " + show_value(v) + ".");
  if (!(v > 0.0))
    throw ScalerError(errc::bad_backoff_factor,
                      "The backoff factor must be > 0.0. Got " + show_value(v) + ".");
}

void check_growth_interval(std::int64_t v) {
  if (v < 1 || v > std::numeric_limits<std::int32_t>::max())
    throw ScalerError(
        errc::bad_growth_interval,
        "The growth interval must be >= 1 and < 2^31. Got " + std::to_string(v) + ".");
}

void check_fits_float(double v, errc code) {
  if (std::isfinite(v) && std::fabs(v) > double(std::numeric_limits<float>::max()))
    throw ScalerError(code, texts::float_overflow);
}

void check_reciprocal_finite(float scale, errc code, const char* what) {
  if (std::isfinite(static_cast<float>(1.0 / double(scale)))) return;  // 0 included: 1/0 is inf
  std::ostringstream s;
  s.precision(std::numeric_limits<float>::max_digits10);
  s << what << " must be at least " << smallest_scale()
    << " as a float (its reciprocal, the unscale factor, must be a finite float; below it every "
       "finite gradient unscales to inf or NaN), got "
    << show_value(double(scale));
  throw ScalerError(code, s.str());
}

void check_init_scale(double v) {
  if (!(v > 0.0) || !std::isfinite(v))
    throw ScalerError(errc::bad_init_scale,
                      "The initial scale must be finite and > 0.0. Got " + show_value(v) + ".");
}

// The setters refuse only what no scaler, enabled or not, could hold (see the class comment).

GradScalerOptions& GradScalerOptions::init_scale(double v) {
  // The scale is a float: a double beyond its range, or one that rounds to 0, would be another
  // scale.
  check_fits_float(v, errc::bad_init_scale);  // torch.full((), v) refuses it with this text
  if (!std::isfinite(v) || static_cast<float>(v) == 0.0f)
    throw ScalerError(
        errc::bad_init_scale,
        "The initial scale must be finite and nonzero as a float. Got " + show_value(v) + ".");
  check_reciprocal_finite(static_cast<float>(v), errc::bad_init_scale, "The initial scale");
  init_scale_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::growth_factor(double v) {
  if (!std::isfinite(v))
    throw ScalerError(errc::bad_growth_factor,
                      "The growth factor must be finite. Got " + show_value(v) + ".");
  growth_factor_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::backoff_factor(double v) {
  if (!std::isfinite(v))
    throw ScalerError(errc::bad_backoff_factor,
                      "The backoff factor must be finite. Got " + show_value(v) + ".");
  backoff_factor_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::growth_interval(std::int64_t v) {
  // The growth tracker is an int32 tensor, as in torch's: no larger interval could ever be reached.
  if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
    throw ScalerError(errc::bad_growth_interval,
                      "The growth interval must fit in int32. Got " + std::to_string(v) + ".");
  growth_interval_ = v;
  return *this;
}

GradScalerOptions GradScalerOptions::positional(double init_scale, double growth_factor,
                                                double backoff_factor, std::int64_t growth_interval,
                                                bool enabled, bool allow_fp16_grads) {
  return GradScalerOptions()
      .enabled(enabled)
      .allow_fp16_grads(allow_fp16_grads)
      .growth_factor(growth_factor)
      .backoff_factor(backoff_factor)
      .growth_interval(growth_interval)
      .init_scale(init_scale);
}

void GradScalerOptions::validate() const {
  if (!enabled_) return;
  check_growth_factor(growth_factor_, /*torch_text=*/true);
  check_backoff_factor(backoff_factor_, /*torch_text=*/true);
  check_growth_interval(growth_interval_);
  check_init_scale(init_scale_);
  check_rule(scale_rule());
}

std::string describe(const GradScalerOptions& o) {
  auto b = [](bool v) { return v ? "true" : "false"; };
  return "enabled=" + std::string(b(o.enabled())) + " init_scale=" + show_value(o.init_scale()) +
         " growth_factor=" + show_value(o.growth_factor()) +
         " backoff_factor=" + show_value(o.backoff_factor()) +
         " growth_interval=" + std::to_string(o.growth_interval()) +
         " rule=" + rule_name(o.rule()) + " min_scale=" + show_value(o.min_scale()) +
         " max_scale=" + show_value(o.max_scale()) +
         " hysteresis=" + std::to_string(o.hysteresis()) +
         " consecutive_hysteresis=" + b(o.consecutive_hysteresis()) +
         " raise_at_min_scale=" + b(o.raise_at_min_scale()) +
         " allow_fp16_grads=" + b(o.allow_fp16_grads());
}

}  // namespace ampactor
