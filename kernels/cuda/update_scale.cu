// The dynamic scale update as a one-thread kernel, so the scale, the growth tracker and found_inf
// stay on the device and the host never waits for them.
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace ampactor::kernels::gpu {
namespace {

__global__ void update_scale_kernel(float* scale, std::int32_t* growth_tracker,
                                    const float* found_inf, ScaleRule rule) {
  ScaleRuleState state{*scale, *growth_tracker};
  apply_scale_rule(rule, state, *found_inf != 0.0f);
  *scale = state.scale;
  *growth_tracker = state.growth_tracker;
}

}  // namespace

int update_scale(float* scale_dev, std::int32_t* growth_tracker_dev, const float* found_inf_dev,
                 ScaleRule rule, void* stream) {
  if (!scale_dev || !growth_tracker_dev || !found_inf_dev) return kInvalidInput;
  update_scale_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scale_dev, growth_tracker_dev,
                                                                      found_inf_dev, rule);
  return int(cudaGetLastError());
}

}  // namespace ampactor::kernels::gpu
