// The fused steps' loops, baseline instruction set.
#define AMPACTOR_LOOPS_NS baseline
#define AMPACTOR_LOOPS_NAME "baseline"
#include "optim_impl.h"

namespace ampactor::kernels::cpu {
const OptimLoopTable& baseline_optim_loops() {
  return baseline::optim_table();
}
}  // namespace ampactor::kernels::cpu
