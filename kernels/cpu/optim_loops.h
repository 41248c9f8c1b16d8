// The fused steps' loops per instruction set (see optim_impl.h). No torch headers.
#pragma once

#include <ampactor/kernels/fused_step.h>

namespace ampactor::kernels::cpu {

/// One variant: each runs elements [begin, end) of one span.
struct OptimLoopTable {
  void (*adam)(const StepSpan&, const AdamConsts&, std::int64_t begin, std::int64_t end);
  void (*sgd)(const StepSpan&, const SgdConsts&, std::int64_t begin, std::int64_t end);
  /// out[i] = a[i] / c exactly as adam divides by sqrt_bc2 (tests sweep it against a division).
  void (*const_div)(const float* a, float* out, std::int64_t n, float c);
  const char* name;
};

const OptimLoopTable& baseline_optim_loops();
const OptimLoopTable& avx2_optim_loops();
const OptimLoopTable& avx512_optim_loops();

}  // namespace ampactor::kernels::cpu
