#include <ampactor/scaler/errors.h>
#include <ampactor/scaler/options.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace ampactor {
namespace {
std::string show(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}
}  // namespace

void check_growth_factor(double v) {
  // `!(v > 1)` also refuses NaN.
  if (!(v > 1.0) || std::isinf(v))
    throw ScalerError(errc::bad_growth_factor,
                      std::string(texts::growth_factor) + " Got " + show(v) + ".");
}

void check_backoff_factor(double v) {
  if (!(v < 1.0))
    throw ScalerError(errc::bad_backoff_factor,
                      std::string(texts::backoff_factor) + " Got " + show(v) + ".");
  if (!(v > 0.0))
    throw ScalerError(errc::bad_backoff_factor,
                      "The backoff factor must be > 0.0. Got " + show(v) + ".");
}

void check_growth_interval(std::int64_t v) {
  if (v < 1 || v > std::numeric_limits<std::int32_t>::max())
    throw ScalerError(
        errc::bad_growth_interval,
        "The growth interval must be >= 1 and < 2^31. Got " + std::to_string(v) + ".");
}

void check_init_scale(double v) {
  if (!(v > 0.0) || !std::isfinite(v))
    throw ScalerError(errc::bad_init_scale,
                      "The initial scale must be finite and > 0.0. Got " + show(v) + ".");
}

// The setters refuse only what no scaler, enabled or not, could hold (see the class comment).

GradScalerOptions& GradScalerOptions::init_scale(double v) {
  // The scale is a float: a double that rounds to inf or 0 would be a different scale. From this
  // bound on a double rounds to inf (and casting one past float's range is undefined).
  constexpr double rounds_to_inf = 0x1.ffffffp127;
  if (std::isnan(v) || std::fabs(v) >= rounds_to_inf || static_cast<float>(v) == 0.0f)
    throw ScalerError(
        errc::bad_init_scale,
        "The initial scale must be finite and nonzero as a float. Got " + show(v) + ".");
  init_scale_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::growth_factor(double v) {
  if (!std::isfinite(v))
    throw ScalerError(errc::bad_growth_factor,
                      "The growth factor must be finite. Got " + show(v) + ".");
  growth_factor_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::backoff_factor(double v) {
  if (!std::isfinite(v))
    throw ScalerError(errc::bad_backoff_factor,
                      "The backoff factor must be finite. Got " + show(v) + ".");
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

void GradScalerOptions::validate() const {
  if (!enabled_) return;
  check_growth_factor(growth_factor_);
  check_backoff_factor(backoff_factor_);
  check_growth_interval(growth_interval_);
  check_init_scale(init_scale_);
}

}  // namespace ampactor
