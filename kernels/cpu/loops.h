// Raw-pointer loops behind the CPU kernels. No torch headers: this file is compiled once per
// instruction set (see loops_impl.h) and dispatched at run time.
#pragma once

#include <cstdint>

namespace ampactor::kernels::cpu {

/// Element types the kernels accept as gradients.
enum class ElemType : std::uint8_t { f32, f64, f16, bf16 };

/// One instruction-set variant of every loop. All return true when they saw an inf or NaN.
/// `stride` is in elements; a stride of 1 takes the vectorised path. The plain loops ignore
/// `absmax`; their *_max forms also raise *absmax to the largest finite |x| they read (before the
/// multiply; an fp64 value rounded toward zero to float), in the same pass.
struct LoopTable {
  /// x[i] *= inv in place (computed in float for the half types, in double for f64).
  using Unscale = bool (*)(ElemType, void* x, std::int64_t n, std::int64_t stride, float inv,
                           float* absmax);
  /// Reads x[i] once and writes nothing.
  using Check = bool (*)(ElemType, const void* x, std::int64_t n, std::int64_t stride,
                         float* absmax);
  /// dst[i] = float(src[i]) * inv; checks src.
  using Move = bool (*)(ElemType src_type, const void* src, std::int64_t src_stride, float* dst,
                        std::int64_t dst_stride, std::int64_t n, float inv, float* absmax);
  Unscale unscale;
  Check check;
  Move move;
  Unscale unscale_max;
  Check check_max;
  Move move_max;
  const char* name;
};

const LoopTable& baseline_loops();
const LoopTable& avx2_loops();
const LoopTable& avx512_loops();

/// The table to run (see pick_isa in cpu_features.h): AVX-512 (F, BW, VL, DQ) where this CPU
/// has it, else AVX2 with F16C and FMA, else the baseline; ATEN_CPU_CAPABILITY=avx2 or default
/// caps it as it caps LibTorch's kernels.
const LoopTable& loops();

}  // namespace ampactor::kernels::cpu
