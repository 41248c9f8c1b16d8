// The fused steps' loops compiled with -mavx2 -mf16c -mfma; only called after a run-time CPU
// check.
#define AMPACTOR_LOOPS_NS avx2
#define AMPACTOR_LOOPS_NAME "avx2"
#include "optim_impl.h"

namespace ampactor::kernels::cpu {
const OptimLoopTable& avx2_optim_loops() {
  return avx2::optim_table();
}
}  // namespace ampactor::kernels::cpu
