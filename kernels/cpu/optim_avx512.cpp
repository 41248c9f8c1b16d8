// The fused steps' loops compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c
// -mfma; only called after a run-time CPU check (has_avx512).
#define AMPACTOR_LOOPS_NS avx512
#define AMPACTOR_LOOPS_NAME "avx512"
#include "optim_impl.h"

namespace ampactor::kernels::cpu {
const OptimLoopTable& avx512_optim_loops() {
  return avx512::optim_table();
}
}  // namespace ampactor::kernels::cpu
