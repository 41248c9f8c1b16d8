// The CPU body of update_scale: the core's rule, on the host.
#include "update_scale_cpu.h"

namespace ampactor::kernels::cpu {

void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf,
                  const ScaleRule& rule) {
  ScaleRuleState state{scale, growth_tracker};
  apply_scale_rule(rule, state, found_inf);
  scale = state.scale;
  growth_tracker = state.growth_tracker;
}

}  // namespace ampactor::kernels::cpu
