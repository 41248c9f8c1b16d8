// The per-optimizer stage machine of torch.amp.GradScaler: READY -> UNSCALED -> STEPPED, and
// back to READY at update().
#pragma once

#include <cstdint>

namespace ampactor {

enum class OptState : std::uint8_t { ready, unscaled, stepped };

const char* to_string(OptState s);

/// Throws torch's ScalerError if unscale_() is not allowed in stage `s`.
void check_can_unscale(OptState s);
/// Throws torch's ScalerError if step() is not allowed in stage `s`.
void check_can_step(OptState s);

}  // namespace ampactor
