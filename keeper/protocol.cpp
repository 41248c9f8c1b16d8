#include <ampactor/keeper/protocol.h>

namespace ampactor {

UnscalePermit UnscalePermit::exactly(std::int32_t n) {
  if (n < 1)
    throw ScalerError(errc::bad_option,
                      "UnscalePermit::exactly(n): n must be >= 1; got " + std::to_string(n));
  return UnscalePermit(Kind::exactly, n);
}

StateDictMsg to_message(const StateDict& sd) {
  StateDictMsg m;
  if (sd.empty()) return m;
  m.empty = false;
  m.scale = sd.get_double("scale");
  m.growth_factor = sd.get_double("growth_factor");
  m.backoff_factor = sd.get_double("backoff_factor");
  m.growth_interval = sd.get_int("growth_interval");
  m.growth_tracker = sd.get_int("_growth_tracker");
  m.has_hysteresis_tracker = sd.contains("_hysteresis_tracker");
  if (m.has_hysteresis_tracker) m.hysteresis_tracker = sd.get_int("_hysteresis_tracker");
  return m;
}

StateDict from_message(const StateDictMsg& m) {
  StateDict sd;
  if (m.empty) return sd;
  sd.set("scale", m.scale);
  sd.set("growth_factor", m.growth_factor);
  sd.set("backoff_factor", m.backoff_factor);
  sd.set("growth_interval", m.growth_interval);
  sd.set("_growth_tracker", m.growth_tracker);
  if (m.has_hysteresis_tracker) sd.set("_hysteresis_tracker", m.hysteresis_tracker);
  return sd;
}

}  // namespace ampactor
