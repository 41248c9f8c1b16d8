// Reading traces of older schema versions: their messages as the current version's values.
#include <cmath>
#include <string>

#include "read_json.h"

namespace ampactor::trace_detail {

std::optional<TraceMessage> read_v1(const std::string& type, const json& j) {
  auto read = [&](auto x) {
    Reader r{j, type};
    v1::fields(r, x);
    r.done();
    return x;
  };
  if (type == "UpdateScale") {
    const auto u = read(v1::UpdateScale{});
    if (u.has_new_scale) return TraceMessage{SetScale{u.k, u.new_scale}};
    if (u.expected_unscales == -1) return TraceMessage{UpdateWhenClosed{u.k}};
    if (u.expected_unscales < 0)
      throw Bad("UpdateScale.expected_unscales: expected -1 or a count >= 0, got " +
                std::to_string(u.expected_unscales));
    return TraceMessage{UpdateScale{u.k, u.expected_unscales}};
  }
  if (type == "GetParams") return TraceMessage{GetParams{read(v1::GetParams{}).up_to_date}};
  if (type == "GetStateDict") return read(v1::GetStateDict{}), TraceMessage{GetStateDict{}};
  if (type == "LoadStateDict") return TraceMessage{LoadStateDict{read(v1::LoadStateDict{}).state}};
  if (type == "SetParam") {
    const auto sp = read(v1::SetParam{});
    switch (sp.which) {
      case v1::Param::growth_factor:
        return TraceMessage{SetGrowthFactor{sp.value}};
      case v1::Param::backoff_factor:
        return TraceMessage{SetBackoffFactor{sp.value}};
      case v1::Param::growth_interval:
        if (!(std::fabs(sp.value) < 9.2e18) || sp.value != std::trunc(sp.value))
          throw Bad("SetParam.value: a growth interval must be an integer, got " +
                    std::to_string(sp.value));
        return TraceMessage{SetGrowthInterval{std::int64_t(sp.value)}};
    }
  }
  return std::nullopt;
}

/// A version 1 to 6 message with version 7's fields: no rule raised (UpdateApplied.halted), none
/// had hysteresis (StateDict's, also inside LoadStateDict), no gradient size was measured (before
/// 5), below_one is what the recorded scale says, there were no ranks (local_found_inf is
/// found_inf; before 6), and neither the attribution nor the collapse guard was recorded
/// (before 7: none, 0 backoffs; replay_trace leaves the guard out of its comparison).
json upgrade_old(const std::string& type, const json& msg, int version) {
  // A field newer than the file's version was not written by that version: refused, not read
  // as the current version's (a version 6 header over version 7 lines replayed into the guard's
  // comparison and diverged).
  struct Since {
    int version;
    const char* type;
    const char* field;
  };
  static constexpr Since added[] = {
      {4, "UpdateApplied", "halted"},         {4, "StateDict", "has_hysteresis_tracker"},
      {4, "StateDict", "hysteresis_tracker"}, {5, "UnscaleDone", "grad_max"},
      {5, "UnscaleDone", "dtype_max"},        {5, "UpdateApplied", "below_one"},
      {6, "UnscaleDone", "local_found_inf"},  {7, "UnscaleDone", "overflow"},
      {7, "UnscaleDone", "found_by"},         {7, "ScaleReply", "backoffs_in_row"},
      {7, "ScaleReply", "collapsing"},        {7, "UpdateApplied", "backoffs_in_row"},
      {7, "UpdateApplied", "collapsing"}};
  const bool load = type == "LoadStateDict" && msg.contains("state") && msg["state"].is_object();
  for (const Since& a : added) {
    if (version >= a.version) continue;
    const bool here = type == a.type && msg.contains(a.field);
    if (here || (load && a.type == std::string("StateDict") && msg["state"].contains(a.field)))
      throw Bad((here ? type : type + ".state") + ": unknown field \"" + a.field +
                "\" in a version " + std::to_string(version) + " trace (since version " +
                std::to_string(a.version) + ")");
  }
  json m = msg;
  if (type == "UnscaleDone" && !m.contains("overflow"))
    m["overflow"] = json::array(), m["found_by"] = json::array();
  if ((type == "ScaleReply" || type == "UpdateApplied") && !m.contains("collapsing"))
    m["backoffs_in_row"] = 0, m["collapsing"] = false;
  if (type == "UnscaleDone" && !m.contains("local_found_inf") && m.contains("found_inf"))
    m["local_found_inf"] = m["found_inf"];
  if (version >= 5) return m;
  if (type == "UnscaleDone" && !m.contains("grad_max")) m["grad_max"] = 0, m["dtype_max"] = 0;
  if (type == "UpdateApplied" && !m.contains("below_one"))
    m["below_one"] = m.contains("scale") && m["scale"].is_number() && m["scale"] < 1.0;
  if (version >= 4) return m;
  if (type == "UpdateApplied" && !m.contains("halted")) m["halted"] = false;
  json* sd = type == "StateDict" ? &m : nullptr;
  if (type == "LoadStateDict" && m.contains("state") && m["state"].is_object()) sd = &m["state"];
  if (sd && !sd->contains("has_hysteresis_tracker")) {
    (*sd)["has_hysteresis_tracker"] = false;
    (*sd)["hysteresis_tracker"] = 0;
  }
  return m;
}

}  // namespace ampactor::trace_detail
