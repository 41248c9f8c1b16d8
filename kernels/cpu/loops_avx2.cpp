// Compiled with -mavx2 -mf16c -mfma; only called after a run-time CPU check.
#define AMPACTOR_LOOPS_NS avx2
#define AMPACTOR_LOOPS_NAME "avx2"
#include "loops_impl.h"

namespace ampactor::kernels::cpu {
const LoopTable& avx2_loops() {
  return avx2::table();
}
}  // namespace ampactor::kernels::cpu
