// The fused steps' loops compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c
// -mfma; only called after a run-time CPU check (has_avx512).
// GCC 12's AVX-512 conversion intrinsics start from an undefined vector of their own (GCC bug
// 105593, fixed in 13), which -Wuninitialized reports once the loop bodies are lambdas.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define AMPACTOR_LOOPS_NS avx512
#define AMPACTOR_LOOPS_NAME "avx512"
#include "optim_impl.h"

namespace ampactor::kernels::cpu {
const OptimLoopTable& avx512_optim_loops() {
  return avx512::optim_table();
}
}  // namespace ampactor::kernels::cpu
