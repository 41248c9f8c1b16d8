// Constructor arguments of torch.amp.GradScaler, with its defaults, as named options:
// GradScalerOptions().init_scale(1024).growth_interval(100).
#pragma once

#include <cstdint>

#include <ampactor/scaler/arg.h>
#include <ampactor/scaler/errors.h>

namespace ampactor {

/// Each setter refuses, with ScalerError and no change, only a value that no scaler could use:
/// a factor that is NaN or infinite (bad_growth_factor, bad_backoff_factor), a growth_interval
/// outside int32 (bad_growth_interval), an init_scale that is NaN or becomes inf or 0 as the float
/// scale (bad_init_scale). The rest (growth_factor > 1, 0 < backoff_factor < 1,
/// growth_interval >= 1, init_scale > 0) is checked only for an enabled scaler, so a disabled one
/// accepts any factors: validate() does those checks and the scalers call it (torch checks
/// growth_factor > 1 and backoff_factor < 1, with the texts used here; the others are ampactor's).
class GradScalerOptions {
  AMPACTOR_ARG(double, init_scale, 65536.0);  // 2^16
  AMPACTOR_ARG(double, growth_factor, 2.0);
  AMPACTOR_ARG(double, backoff_factor, 0.5);
  AMPACTOR_ARG(std::int64_t, growth_interval, 2000);
  AMPACTOR_ARG_ANY(bool, enabled, true);
  /// ampactor extension: let unscale_ take fp16 gradients (torch refuses them with a ValueError).
  AMPACTOR_ARG_ANY(bool, allow_fp16_grads, false);

 public:
  /// Throws ScalerError unless growth_factor > 1, 0 < backoff_factor < 1,
  /// 1 <= growth_interval < 2^31 and init_scale is finite and > 0. Like torch, a disabled
  /// scaler's factors are not checked.
  /// torch's positional constructor's values through the setters, in validate()'s order, so a
  /// call with several bad values is refused for the same one.
  static GradScalerOptions positional(double init_scale, double growth_factor,
                                      double backoff_factor, std::int64_t growth_interval,
                                      bool enabled, bool allow_fp16_grads = false);
  void validate() const;
};

/// Individual checks, shared by the constructor, the setters and load_state_dict. torch_text:
/// torch's constructor text alone (torch checks nothing else); otherwise the value is appended.
void check_growth_factor(double v, bool torch_text = false);
void check_backoff_factor(double v, bool torch_text = false);
void check_growth_interval(std::int64_t v);
void check_init_scale(double v);
/// Throws ScalerError(code, texts::float_overflow) for a finite double beyond float's range, as
/// c10 refuses to convert one (inf and NaN are left to the caller's own checks).
void check_fits_float(double v, errc code);

}  // namespace ampactor
