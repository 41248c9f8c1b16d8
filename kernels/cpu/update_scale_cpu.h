// The CPU body of update_scale (kernels/update_scale.cpp checks the tensors first).
#pragma once

#include <ampactor/core/update_rule.h>

#include <cstdint>

namespace ampactor::kernels::cpu {

/// One step of `rule` on the host's scale and growth tracker.
void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf,
                  const ScaleRule& rule);

}  // namespace ampactor::kernels::cpu
