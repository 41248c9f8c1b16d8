// Options by position, as torch's constructor takes them.
#pragma once

#include <ampactor/core/options.h>

namespace ampactor::test {
inline GradScalerOptions opts(double init, double growth, double backoff, std::int64_t interval) {
  return GradScalerOptions()
      .init_scale(init)
      .growth_factor(growth)
      .backoff_factor(backoff)
      .growth_interval(interval);
}
}  // namespace ampactor::test
