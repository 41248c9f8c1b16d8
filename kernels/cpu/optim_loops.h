// The fused steps' loops per instruction set (see optim_impl.h). No torch headers.
#pragma once

#include <ampactor/kernels/fused_step.h>

namespace ampactor::kernels::cpu {

/// One variant: each runs elements [begin, end) of one span.
struct OptimLoopTable {
  void (*adam)(const StepSpan&, const AdamConsts&, std::int64_t begin, std::int64_t end);
  void (*sgd)(const StepSpan&, const SgdConsts&, std::int64_t begin, std::int64_t end);
  const char* name;
};

const OptimLoopTable& baseline_optim_loops();
const OptimLoopTable& avx2_optim_loops();
const OptimLoopTable& avx512_optim_loops();

}  // namespace ampactor::kernels::cpu
