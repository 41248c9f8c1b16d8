// GPU figures of ampactor-bench-kernels (bench_kernels_gpu.cpp): the CUDA kernels beside a
// device-to-device copy of the same bytes and, with a CUDA LibTorch, torch's own fused kernel.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace ampactor::bench {

struct GpuBenchOptions {
  std::vector<std::int64_t> sizes_mb;  // total fp32 gradient bytes per list, in MiB
  int tensors = 128;                   // tensors per list
  int min_reps = 5;
};

/// Prints the GPU figures and adds them to `out` under "gpu/..."; prints why and returns when
/// there is no device or the build has no CUDA.
void run_gpu_figures(const GpuBenchOptions& opts, nlohmann::json& out);

}  // namespace ampactor::bench
