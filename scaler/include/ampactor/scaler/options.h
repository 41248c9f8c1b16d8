// Constructor arguments of torch.amp.GradScaler, with its defaults.
#pragma once

#include <cstdint>

namespace ampactor {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
  /// ampactor extension: let unscale_ take fp16 gradients (torch refuses them with a ValueError).
  bool allow_fp16_grads = false;

  /// Throws ScalerError unless growth_factor > 1, 0 < backoff_factor < 1,
  /// 1 <= growth_interval < 2^31 and init_scale is finite and > 0. Like torch, a disabled
  /// scaler's factors are not checked.
  void validate() const;
};

/// Individual checks, shared by the constructor, the setters and load_state_dict.
void check_growth_factor(double v);
void check_backoff_factor(double v);
void check_growth_interval(std::int64_t v);
void check_init_scale(double v);

}  // namespace ampactor
