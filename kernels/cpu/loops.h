// Raw-pointer loops behind the CPU kernels. No torch headers: this file is compiled once per
// instruction set (see loops_impl.h) and dispatched at run time.
#pragma once

#include <cstdint>

namespace ampactor::kernels::cpu {

/// Element types the kernels accept as gradients.
enum class ElemType : std::uint8_t { f32, f64, f16, bf16 };

/// One instruction-set variant of every loop. All return true when they saw an inf or NaN.
/// `stride` is in elements; a stride of 1 takes the vectorised path.
struct LoopTable {
  /// x[i] *= inv in place (computed in float for the half types, in double for f64).
  bool (*unscale)(ElemType, void* x, std::int64_t n, std::int64_t stride, float inv);
  /// Reads x[i] once and writes nothing.
  bool (*check)(ElemType, const void* x, std::int64_t n, std::int64_t stride);
  /// dst[i] = float(src[i]) * inv; checks src.
  bool (*move)(ElemType src_type, const void* src, std::int64_t src_stride, float* dst,
               std::int64_t dst_stride, std::int64_t n, float inv);
  const char* name;
};

const LoopTable& baseline_loops();
const LoopTable& avx2_loops();

/// The best table this CPU supports (AVX2 with F16C and FMA, else the baseline).
const LoopTable& loops();

}  // namespace ampactor::kernels::cpu
