// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mfma; only called
// after a run-time CPU check (has_avx512).
#define AMPACTOR_LOOPS_NS avx512
#define AMPACTOR_LOOPS_NAME "avx512"
#include "loops_impl.h"

namespace ampactor::kernels::cpu {
const LoopTable& avx512_loops() {
  return avx512::table();
}
}  // namespace ampactor::kernels::cpu
