#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/core/state_dict.h>

#include <cmath>
#include <cstdint>

namespace ampactor {

double StateDict::get_double(const std::string& key) const {
  auto it = items_.find(key);
  if (it == items_.end())
    throw ScalerError(errc::bad_state_dict, "state_dict is missing the key '" + key + "'");
  if (auto* i = std::get_if<std::int64_t>(&it->second)) return double(*i);
  return std::get<double>(it->second);
}

std::int64_t StateDict::get_int(const std::string& key) const {
  auto it = items_.find(key);
  if (it == items_.end())
    throw ScalerError(errc::bad_state_dict, "state_dict is missing the key '" + key + "'");
  if (!std::holds_alternative<std::int64_t>(it->second))
    throw ScalerError(errc::bad_state_dict,
                      "state_dict['" + key + "'] must be an int, got a float");
  return std::get<std::int64_t>(it->second);
}

StateDict make_state_dict(const ScaleState& state) {
  StateDict sd;
  sd.set("scale", state.get_scale());
  sd.set("growth_factor", state.growth_factor());
  sd.set("backoff_factor", state.backoff_factor());
  sd.set("growth_interval", state.growth_interval());
  sd.set("_growth_tracker", state.growth_tracker());
  if (rule_has_hysteresis(state.rule().kind))
    sd.set("_hysteresis_tracker", state.hysteresis_tracker());
  return sd;
}

void load_state_dict(ScaleState& state, const StateDict& sd) {
  if (sd.empty()) throw ScalerError(errc::empty_state_dict, texts::empty_state_dict);
  const double scale = sd.get_double("scale");
  const double growth = sd.get_double("growth_factor");
  const double backoff = sd.get_double("backoff_factor");
  const std::int64_t interval = sd.get_int("growth_interval");
  const std::int64_t tracker = sd.get_int("_growth_tracker");
  // A live scale may have decayed towards 0, so any positive float is taken; 0 (as a float) is
  // a scaler that can never recover (every step skipped, every backoff 0 again), so it is refused.
  check_fits_float(scale, errc::bad_state_dict);  // torch's fill_ into the float scale refuses it
  if (!std::isfinite(scale) || !(static_cast<float>(scale) > 0.0f))
    throw ScalerError(
        errc::bad_state_dict,
        "state_dict['scale'] must be finite and > 0 as a float, got " + show_value(scale));
  check_reciprocal_finite(static_cast<float>(scale), errc::bad_state_dict, "state_dict['scale']");
  if (tracker < 0 || tracker > INT32_MAX)
    throw ScalerError(
        errc::bad_state_dict,
        "state_dict['_growth_tracker'] must be in [0, 2^31), got " + std::to_string(tracker));
  // ampactor's own key, for the rules with hysteresis (megatron's tracker goes below 0); a dict
  // without it (torch's) leaves the hysteresis full. A rule without hysteresis ignores it, as
  // torch ignores keys it does not know.
  std::int64_t hysteresis = state.rule().hysteresis;
  if (rule_has_hysteresis(state.rule().kind) && sd.contains("_hysteresis_tracker")) {
    hysteresis = sd.get_int("_hysteresis_tracker");
    if (hysteresis < INT32_MIN || hysteresis > INT32_MAX)
      throw ScalerError(
          errc::bad_state_dict,
          "state_dict['_hysteresis_tracker'] must fit in int32, got " + std::to_string(hysteresis));
  }
  try {
    check_growth_factor(growth);
    check_backoff_factor(backoff);
    check_growth_interval(interval);
    ScaleRule rule = state.rule();
    rule.growth_factor = growth;
    rule.backoff_factor = backoff;
    rule.growth_interval = interval;
    check_rule(rule);
  } catch (const ScalerError& e) {
    throw ScalerError(errc::bad_state_dict, std::string("state_dict: ") + e.what());
  }
  state.load(scale, growth, backoff, interval, tracker);
  state.load_hysteresis(hysteresis);
}

}  // namespace ampactor
