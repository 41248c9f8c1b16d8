#include <ampactor/core/errors.h>
#include <ampactor/core/stage.h>

namespace ampactor {

const char* to_string(OptState s) {
  switch (s) {
    case OptState::ready:
      return "READY";
    case OptState::unscaled:
      return "UNSCALED";
    case OptState::stepped:
      return "STEPPED";
  }
  return "?";
}

void check_can_unscale(OptState s) {
  if (s == OptState::unscaled) throw ScalerError(errc::unscale_twice, texts::unscale_twice);
  if (s == OptState::stepped)
    throw ScalerError(errc::unscale_after_step, texts::unscale_after_step);
}

void check_can_step(OptState s) {
  if (s == OptState::stepped) throw ScalerError(errc::step_twice, texts::step_twice);
}

}  // namespace ampactor
