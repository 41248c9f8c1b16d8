// Includes and helpers shared by the CUDA kernel tests.
// The CUDA kernels against the CPU kernels, which are themselves tested against plain LibTorch
// (test_kernels.cpp): every dtype, contiguous, transposed and sliced gradients, with and without
// inf/NaN, and lists of 1 to 2100 tensors of odd sizes. The raw launchers are driven through the
// CUDA runtime, so they run on any GPU machine even with a CPU-only LibTorch; the tensor entry
// points on CUDA tensors are tested where LibTorch has CUDA. Without a device every GPU test
// prints "skipped: ..." and passes. update_scale's CPU path is in test_update_rule.cpp.
#pragma once
#include "doctest_torch.h"

#include <ampactor/core/update_rule.h>
#include <ampactor/kernels/unscale.h>
#include <ampactor/kernels/update_scale.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "refusal.h"
#include "tensor_helpers.h"

#ifdef AMPACTOR_CUDA_BUILT
#include <cuda_runtime_api.h>

#include "launch.h"
#endif

using namespace ampactor::test;
namespace k = ampactor::kernels;

namespace {

/// Why the GPU tests cannot run here, or nullptr when they can.
inline const char* gpu_skip_reason() {
#ifdef AMPACTOR_CUDA_BUILT
  static const bool have = ampactor::kernels::gpu::device_count() > 0;
  return have ? nullptr : "no CUDA device";
#else
  return "built without CUDA (AMPACTOR_CUDA=OFF)";
#endif
}

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    if (const char* why = gpu_skip_reason()) AMPACTOR_SKIP_NO_GPU(why); \
  } while (0)

/// The whole storage under a CPU view, as a flat tensor of its dtype.
at::Tensor flat_storage(const at::Tensor& t) {
  const std::int64_t n = std::int64_t(t.storage().nbytes() / t.element_size());
  return t.as_strided({n}, {1}, 0);
}

/// A fresh copy of t's whole storage and the same view on it.
[[maybe_unused]] at::Tensor deep_copy(const at::Tensor& t) {
  return flat_storage(t).clone().as_strided(t.sizes(), t.strides(), t.storage_offset());
}

[[maybe_unused]] std::vector<at::Tensor> make_list(at::ScalarType dtype, Layout l, Poison p,
                                                   std::uint64_t seed) {
  const std::int64_t shapes[][2] = {{3, 5}, {1, 1}, {17, 9}, {129, 33}, {613, 541}, {2, 7}};
  std::vector<at::Tensor> out;
  for (auto& s : shapes)
    out.push_back(make_grad(s[0], s[1], dtype, l, seed++));
  poison(out[4], p, 613 * 541 / 2 + 3);
  poison(out.back(), p, 13);
  return out;
}

[[maybe_unused]] float expected_flag(Poison p) {
  return p == Poison::none ? 0.0f : 1.0f;
}

}  // namespace
