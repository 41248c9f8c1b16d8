#define AMPACTOR_LOOPS_NS baseline
#define AMPACTOR_LOOPS_NAME "baseline"
#include "loops_impl.h"

namespace ampactor::kernels::cpu {
const LoopTable& baseline_loops() {
  return baseline::table();
}
}  // namespace ampactor::kernels::cpu
