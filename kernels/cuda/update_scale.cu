// The dynamic scale update as a one-thread kernel, so the scale, the growth tracker and found_inf
// stay on the device and the host never waits for them.
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace ampactor::kernels::gpu {
namespace {

// Mirrors apply_update_rule in scaler/scale_state.cpp: products in double rounded to float once,
// growth only when the tracker reaches the interval exactly (==), and only to a finite scale.
__global__ void update_scale_kernel(float* scale, std::int32_t* growth_tracker,
                                    const float* found_inf, double growth_factor,
                                    double backoff_factor, long long growth_interval) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(double(*scale) * backoff_factor);
    *growth_tracker = 0;
    return;
  }
  const std::int32_t successful = *growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(double(*scale) * growth_factor);
    if (isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
  }
}

}  // namespace

int update_scale(float* scale_dev, std::int32_t* growth_tracker_dev, const float* found_inf_dev,
                 double growth_factor, double backoff_factor, std::int64_t growth_interval,
                 void* stream) {
  if (!scale_dev || !growth_tracker_dev || !found_inf_dev) return kInvalidInput;
  update_scale_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      scale_dev, growth_tracker_dev, found_inf_dev, growth_factor, backoff_factor,
      static_cast<long long>(growth_interval));
  return int(cudaGetLastError());
}

}  // namespace ampactor::kernels::gpu
