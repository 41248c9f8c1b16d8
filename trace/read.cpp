// Reading traces: every line checked (fields, types, sequence), older versions brought up to date.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "trace_fields.h"

namespace ampactor {
namespace {

using namespace trace_detail;
using nlohmann::json;

/// A problem on the line being read (the reader adds file and line).
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string json_kind(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

struct Reader {
  Reader(const json& obj, std::string w) : j(obj), where(std::move(w)) {}
  const json& j;
  std::string where;  // e.g. "UnscaleDone"
  std::vector<std::string> seen;

  const json& at(const char* name) {
    auto it = j.find(name);
    if (it == j.end()) throw Bad(where + ": missing field \"" + name + "\"");
    seen.emplace_back(name);
    return *it;
  }
  [[noreturn]] void wrong(const char* name, const json& v, const char* want) {
    throw Bad(where + "." + name + ": expected " + want + ", got " + json_kind(v) + " " + v.dump());
  }
  template <class Int>
  void integer(const char* name, Int& x) {
    const json& v = at(name);
    if (!v.is_number_integer()) wrong(name, v, "an integer");
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > std::uint64_t(std::numeric_limits<Int>::max())) wrong(name, v, "a smaller integer");
      x = Int(u);
      return;
    }
    const auto s = v.get<std::int64_t>();
    if (s < std::int64_t(std::numeric_limits<Int>::min()) ||
        (s > 0 && std::uint64_t(s) > std::uint64_t(std::numeric_limits<Int>::max())))
      wrong(name, v, "an integer in range");
    x = Int(s);
  }
  double real(const char* name) {
    const json& v = at(name);
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const auto& s = v.get_ref<const std::string&>();
      if (s == "inf") return INFINITY;
      if (s == "-inf") return -INFINITY;
      if (s == "nan") return NAN;
    }
    wrong(name, v, "a number (or \"inf\", \"-inf\", \"nan\")");
  }
  void operator()(const char* name, bool& x) {
    const json& v = at(name);
    if (!v.is_boolean()) wrong(name, v, "a boolean");
    x = v.get<bool>();
  }
  void operator()(const char* name, float& x) { x = float(real(name)); }
  void operator()(const char* name, double& x) { x = real(name); }
  void operator()(const char* name, std::int32_t& x) { integer(name, x); }
  void operator()(const char* name, std::int64_t& x) { integer(name, x); }
  void operator()(const char* name, std::uint64_t& x) { integer(name, x); }
  void operator()(const char* name, std::string& x) {
    const json& v = at(name);
    if (!v.is_string()) wrong(name, v, "a string");
    x = v.get<std::string>();
  }
  void operator()(const char* name, v1::Param& x) {
    using v1::Param;
    const json& v = at(name);
    for (Param p : {Param::growth_factor, Param::backoff_factor, Param::growth_interval})
      if (v.is_string() && v.get_ref<const std::string&>() == v1::param_name(p)) {
        x = p;
        return;
      }
    wrong(name, v, "\"growth_factor\", \"backoff_factor\" or \"growth_interval\"");
  }
  void operator()(const char* name, errc& x) {
    const json& v = at(name);
    for (int c = 1; c <= errc_last; ++c)
      if (v.is_string() && v.get_ref<const std::string&>() == to_string(errc(c))) {
        x = errc(c);
        return;
      }
    wrong(name, v, "an ampactor error code name");
  }
  void operator()(const char* name, StateDictMsg& x) {
    const json& v = at(name);
    if (!v.is_object()) wrong(name, v, "an object");
    Reader sub{v, where + "." + name};
    fields(sub, x);
    sub.done();
  }
  /// Every field was read: an unknown one is an error (a newer schema has a new version).
  void done() const {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (std::find(seen.begin(), seen.end(), it.key()) == seen.end())
        throw Bad(where + ": unknown field \"" + it.key() + "\"");
  }
};

template <class T>
TraceMessage read_as(const json& j) {
  T x{};
  Reader r{j, TypeName<T>::value};
  fields(r, x);
  r.done();
  return x;
}

using ReadFn = TraceMessage (*)(const json&);
struct Known {
  const char* name;
  ReadFn read;
};
template <class... Ts>
constexpr std::array<Known, sizeof...(Ts)> known_types(std::variant<Ts...>*) {
  return {Known{TypeName<Ts>::value, &read_as<Ts>}...};
}
const auto known = known_types(static_cast<TraceMessage*>(nullptr));

std::string known_list() {
  std::string s;
  for (const auto& k : known)
    s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

/// A version 1 message that version 2 replaced, as its version 2 value (nullopt: not one).
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

TraceHeader read_header(const json& j) {
  if (!j.is_object()) throw Bad("the header must be a JSON object, got " + json_kind(j));
  auto t = j.find("trace");
  if (t == j.end() || !t->is_string() || *t != "ampactor")
    throw Bad("not an ampactor trace: the header needs \"trace\": \"ampactor\"");
  Reader r{j, "header"};
  r.seen.emplace_back("trace");
  std::int64_t version = 0;
  r.integer("version", version);
  if (version < 1 || version > trace_schema_version)
    throw Bad("unsupported trace schema version " + std::to_string(version) +
              " (this build reads versions 1 to " + std::to_string(trace_schema_version) + ")");
  TraceHeader h;
  h.version = int(version);
  std::string policy;
  r("policy", policy);
  if (policy == "exact")
    h.policy = ScalePolicy::exact;
  else if (policy == "lagged")
    h.policy = ScalePolicy::lagged;
  else
    throw Bad("header.policy: expected \"exact\" or \"lagged\", got \"" + policy + "\"");
  const json& o = r.at("options");
  if (!o.is_object()) r.wrong("options", o, "an object");
  Reader ro{o, "header.options"};
  OptionValues values;
  values.apply(ro);
  RuleValues rule;
  if (o.contains("rule")) {
    const json& jr = ro.at("rule");
    if (!jr.is_object()) ro.wrong("rule", jr, "an object");
    Reader rr{jr, "header.options.rule"};
    rule.apply(rr);
    rr.done();
  }
  ro.done();
  r.done();
  try {
    h.opts = values.options();
    rule.set(h.opts);
    h.opts.validate();
  } catch (const ScalerError& e) {
    throw Bad(std::string("header.options: ") + e.what());
  }
  return h;
}

/// A version 1 to 4 message with version 5's fields: no rule raised (UpdateApplied.halted), none
/// had hysteresis (StateDict's, also inside LoadStateDict), no gradient size was measured, and
/// below_one is what the recorded scale says.
json upgrade_to_v5(const std::string& type, const json& msg, int version) {
  json m = msg;
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

TraceEvent read_event(const json& j, std::uint64_t expected_seq, int version) {
  if (!j.is_object()) throw Bad("expected a JSON object, got " + json_kind(j));
  TraceEvent e;
  Reader r{j, "event"};
  r.integer("seq", e.seq);
  if (e.seq != expected_seq)
    throw Bad("sequence number " + std::to_string(e.seq) + " out of order (expected " +
              std::to_string(expected_seq) + ")");
  r.integer("k", e.k);
  r("from", e.from);
  r("to", e.to);
  std::string type;
  r("type", type);
  const json& raw = r.at("msg");
  if (!raw.is_object()) r.wrong("msg", raw, "an object");
  r.done();
  const json msg = version <= 4 ? upgrade_to_v5(type, raw, version) : raw;
  std::optional<TraceMessage> v1_msg;
  if (version == 1) v1_msg = read_v1(type, msg);
  if (v1_msg) {
    // Version 1 gave monitor queries the trainer's iteration; version 2 gives them none.
    const bool monitor = type != "UpdateScale";
    if (monitor) e.k = -1;
    e.msg = std::move(*v1_msg);
  } else {
    const Known* kind = nullptr;
    for (const auto& k : known)
      if (type == k.name) kind = &k;
    const bool v2_only = type == "UpdateWhenClosed" || type == "SetScale" ||
                         type == "SetGrowthFactor" || type == "SetBackoffFactor" ||
                         type == "SetGrowthInterval" || type == "Unsubscribe";
    if (!kind || (version == 1 && v2_only))
      throw Bad("unknown message type \"" + type + "\" (known: " + known_list() + ")");
    if (version == 2 && type == "SetScale" && !msg.contains("after_jobs")) {
      json m = msg;  // version 2 applied update(new_scale) at once
      m["after_jobs"] = false;
      e.msg = kind->read(m);
    } else {
      e.msg = kind->read(msg);
    }
    if (version == 1 && (type == "ScaleParams" || type == "StateDict" || type == "Error"))
      e.k = -1;  // replies to monitor queries, which version 2 files under no iteration
  }
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (has_k<T>::value) {
          if (m.k != e.k)
            throw Bad("event k " + std::to_string(e.k) + " differs from msg.k " +
                      std::to_string(m.k));
        }
      },
      e.msg);
  if (auto* d = std::get_if<UnscaleDone>(&e.msg))
    if (!(d->grad_max >= 0 && d->dtype_max >= 0 && std::isfinite(d->dtype_max) &&
          (d->dtype_max == 0 ? d->grad_max == 0 : d->grad_max <= d->dtype_max)))
      throw Bad("UnscaleDone: grad_max must lie in [0, dtype_max] (both 0: not measured)");
  if (is_keeper_input(e.msg) ? e.to != trace_keeper : e.from != trace_keeper)
    throw Bad(type + (is_keeper_input(e.msg) ? " must go to" : " must come from") + " \"keeper\"");
  return e;
}

}  // namespace

// ---- reading ----
TraceError::TraceError(const std::string& source, std::size_t line, const std::string& problem)
    : std::runtime_error(line ? source + ":" + std::to_string(line) + ": " + problem
                              : source + ": " + problem),
      line_(line) {}

namespace {

/// The trailer of a version 3 trace: {"end":"ampactor","events":N}, N the events before it.
void read_trailer(const json& j, std::size_t events) {
  Reader r{j, "trailer"};
  std::string end;
  r("end", end);
  if (end != "ampactor") throw Bad("trailer.end: expected \"ampactor\", got \"" + end + "\"");
  std::int64_t n = -1;
  r.integer("events", n);
  r.done();
  if (n < 0 || std::size_t(n) != events)
    throw Bad("the trailer counts " + std::to_string(n) + " events, the trace holds " +
              std::to_string(events) + " (lines lost or added)");
}

}  // namespace

Trace parse_trace(std::istream& in, const std::string& source, bool prefix) {
  Trace t;
  std::string text;
  std::size_t line = 0;
  bool have_header = false;
  bool blank_seen = false;
  bool trailer_seen = false;
  std::size_t blank_line = 0;
  // A bad line ends the intact part when reading a prefix; the header must be whole either way.
  auto stop = [&](std::size_t at, const std::string& why) {
    if (!prefix || !have_header) throw TraceError(source, at, why);
    t.complete = false;
    t.stopped_at = at;
    t.stop_reason = why;
  };
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) {
      if (!blank_seen) blank_line = line;
      blank_seen = true;
      continue;
    }
    if (blank_seen) {
      stop(blank_line, "empty line inside the trace");
      break;
    }
    if (trailer_seen) {
      stop(line, "a line after the trailer");
      break;
    }
    std::string why;
    try {
      const json j = json::parse(text);
      if (!have_header) {
        t.header = read_header(j);
        have_header = true;
        t.complete = t.header.version < 3;  // from version 3, complete once its trailer is read
      } else if (t.header.version >= 3 && j.is_object() && j.contains("end")) {
        read_trailer(j, t.events.size());
        trailer_seen = true;
        t.complete = true;
      } else {
        t.events.push_back(read_event(j, t.events.size(), t.header.version));
        t.lines.push_back(line);
      }
      continue;
    } catch (const json::parse_error& e) {
      why = "not valid JSON (truncated or corrupt line): " + std::string(e.what());
    } catch (const Bad& b) {
      why = b.what();
    } catch (const json::exception& e) {  // out_of_range for 1e309; a value of an unexpected type
      why = e.what();
    }
    stop(line, why);
    break;
  }
  if (in.bad()) throw TraceError(source, line, "read error");
  if (!have_header) throw TraceError(source, 1, "empty trace: no header line");
  return t;
}

Trace read_trace(const std::string& path, bool prefix) {
  std::ifstream in(path);
  if (!in) throw TraceError(path, 0, std::string("cannot open: ") + std::strerror(errno));
  return parse_trace(in, path, prefix);
}

}  // namespace ampactor
