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

void GradScalerOptions::validate() const {
  if (!enabled) return;
  check_growth_factor(growth_factor);
  check_backoff_factor(backoff_factor);
  check_growth_interval(growth_interval);
  check_init_scale(init_scale);
}

}  // namespace ampactor
