// Options by position, as torch's constructor takes them.
#pragma once

#include <ampactor/scaler/options.h>

namespace ampactor::test {
inline GradScalerOptions opts(double init, double growth, double backoff, std::int64_t interval) {
  GradScalerOptions o;
  o.init_scale = init;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  return o;
}
}  // namespace ampactor::test
