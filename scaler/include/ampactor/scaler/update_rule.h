// The dynamic loss-scale update rule, written once for every place that applies it: the scaler
// core (ScaleState), the kernels' CPU path and the one-thread CUDA kernel. No torch and no CUDA
// headers, so a .cu file can include it.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define AMPACTOR_HOST_DEVICE __host__ __device__
#else
#define AMPACTOR_HOST_DEVICE
#endif

namespace ampactor {

/// The parameters of the rule, as plain data a kernel takes by value. Other rules (e.g.
/// DeepSpeed's hysteresis and min/max scale) are meant to join as more fields and a kind to
/// switch on; today it is torch's rule alone.
struct ScaleRule {
  double growth_factor;
  double backoff_factor;
  std::int64_t growth_interval;
};

/// What the rule acts on: torch keeps the scale as float and the tracker as int32.
struct ScaleRuleState {
  float scale;
  std::int32_t growth_tracker;
};

/// What one application of the update rule did.
struct UpdateOutcome {
  bool backed_off = false;      // found_inf: scale *= backoff, tracker reset
  bool grew = false;            // tracker reached the interval and the grown scale was finite
  bool growth_refused = false;  // tracker reached the interval but the grown scale was not finite
};

namespace detail {
/// std::isfinite is host-only; CUDA's isfinite is its device twin.
AMPACTOR_HOST_DEVICE inline bool finite(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}
}  // namespace detail

/// torch's _amp_update_scale_, bit for bit. Products are taken in double (the factors are doubles
/// in torch) and rounded to float once. Growth happens when the tracker reaches the interval
/// exactly (`==`, not `>=`: an interval lowered below the tracker stalls growth until the next
/// backoff, as in torch), and only to a finite scale. A tracker at INT32_MAX stays there where
/// torch's int32 `tracker + 1` would overflow.
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_scale_rule(const ScaleRule& rule,
                                                           ScaleRuleState& state, bool found_inf) {
  UpdateOutcome out;
  if (found_inf) {
    state.scale = static_cast<float>(double(state.scale) * rule.backoff_factor);
    state.growth_tracker = 0;
    out.backed_off = true;
    return out;
  }
  const std::int64_t successful = std::int64_t(state.growth_tracker) + 1;
  if (successful == rule.growth_interval) {
    const float grown = static_cast<float>(double(state.scale) * rule.growth_factor);
    if (detail::finite(grown)) {
      state.scale = grown;
      out.grew = true;
    } else {
      out.growth_refused = true;
    }
    state.growth_tracker = 0;
  } else if (successful <= INT32_MAX) {
    state.growth_tracker = static_cast<std::int32_t>(successful);
  }
  return out;
}

}  // namespace ampactor
