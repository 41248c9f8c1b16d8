// Reading traces: every line checked (fields, types, sequence), older versions brought up to date.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "read_json.h"
#include "trace_fields.h"

namespace ampactor {
namespace {

using namespace trace_detail;
using nlohmann::json;

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

/// Reads a message with its type's reader: everything read_v1 did not take.
void read_known(TraceEvent& e, const std::string& type, const json& msg, int version) {
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

/// Reads e.msg from the event's "msg", brought up to date from older versions first.
void read_message(TraceEvent& e, const std::string& type, const json& raw, int version) {
  const json msg = version <= 6 ? upgrade_old(type, raw, version) : raw;
  std::optional<TraceMessage> v1_msg;
  if (version == 1) v1_msg = read_v1(type, msg);
  if (v1_msg) {
    // Version 1 gave monitor queries the trainer's iteration; version 2 gives them none.
    const bool monitor = type != "UpdateScale";
    if (monitor) e.k = -1;
    e.msg = std::move(*v1_msg);
  } else {
    read_known(e, type, msg, version);
  }
}

std::string ranks_text(const std::vector<std::int32_t>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  return "[" + s + (ranks.size() > 8 ? ",...]" : "]");
}

/// Values of the right type that no recording holds (unchecked, each replayed as identical).
void check_unscale_values(const UnscaleDone& d) {
  // Checked as the float it is stored in (1e39 reads as inf). The keeper's scales are finite and
  // never negative; torch's rule can back off to 0.
  if (!std::isfinite(d.scale_used) || std::signbit(d.scale_used))
    throw Bad("UnscaleDone.scale_used: expected a finite scale >= 0 (as a float), got " +
              show_value(d.scale_used));
  // The ranks' agreement lists them in rank order, each once.
  if (std::adjacent_find(d.found_by.begin(), d.found_by.end(), std::greater_equal<>()) !=
      d.found_by.end())
    throw Bad("UnscaleDone.found_by: expected ascending ranks, each once, got " +
              ranks_text(d.found_by));
  // A position in the optimizer's std::vector of parameters: below its max_size(), which is at
  // most PTRDIFF_MAX. The uint64 it is stored in holds more.
  constexpr auto positions = std::uint64_t(std::numeric_limits<std::ptrdiff_t>::max());
  for (std::size_t i = 0; i < d.overflow.size(); ++i)
    if (d.overflow[i].index >= positions)
      throw Bad("UnscaleDone.overflow[" + std::to_string(i) +
                "].index: expected a parameter's position (below 2^63 - 1), got " +
                std::to_string(d.overflow[i].index));
}

void check_count(const std::string& type, std::int32_t unscales) {
  if (unscales < 0)
    throw Bad(type + ".unscales: expected a count >= 0, got " + std::to_string(unscales));
}

/// Data parallel: an optimizer reports from one rank, and found_by lists that rank exactly when
/// its own check found the overflow (local_found_inf). No trace records the world size, so this
/// is what bounds the ranks: reports that no one rank could have sent are refused.
class OwnRanks {
 public:
  void check(const UnscaleDone& d) {
    if (d.found_by.empty()) return;  // no ranks (or a path that does not say which)
    Of& o = of_[d.optimizer];
    const bool was_known = o.known;
    const std::vector<std::int32_t> was = o.may_be;
    if (!d.local_found_inf) {
      o.is_not.insert(d.found_by.begin(), d.found_by.end());
    } else if (!o.known) {
      o.may_be = d.found_by, o.known = true;
    } else {
      o.may_be.clear();
      std::set_intersection(was.begin(), was.end(), d.found_by.begin(), d.found_by.end(),
                            std::back_inserter(o.may_be));
    }
    if (!o.known) return;
    std::vector<std::int32_t> left;
    for (std::int32_t r : o.may_be)
      if (!o.is_not.count(r)) left.push_back(r);
    if (left.empty())
      throw Bad("UnscaleDone.found_by: no rank fits optimizer " + std::to_string(d.optimizer) +
                "'s reports (found_by lists its own rank exactly when local_found_inf): " +
                ranks_text(d.found_by) + " with local_found_inf " +
                (d.local_found_inf ? "true" : "false") + ", where its earlier reports " +
                (was_known ? "put it at " + ranks_text(was)
                           : "rule out " + ranks_text({o.is_not.begin(), o.is_not.end()})));
    o.may_be = std::move(left);
  }

 private:
  struct Of {
    bool known = false;                // a report said its own check found the overflow
    std::vector<std::int32_t> may_be;  // ascending: in each such report's found_by, no is_not
    std::set<std::int32_t> is_not;     // in the found_by of a report whose own check found none
  };
  std::map<optimizer_id, Of> of_;
};

/// The checks across an event's fields, once its message is read.
void check_event(const TraceEvent& e, const std::string& type) {
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
  if (auto* d = std::get_if<UnscaleDone>(&e.msg))
    if (d->local_found_inf && !d->found_inf)
      throw Bad(
          "UnscaleDone: local_found_inf without found_inf (the agreed value is the ranks' "
          "largest)");
  if (auto* d = std::get_if<UnscaleDone>(&e.msg))
    if (!d->found_inf && (!d->overflow.empty() || !d->found_by.empty()))
      throw Bad("UnscaleDone: overflow or found_by without found_inf");
  if (auto* d = std::get_if<UnscaleDone>(&e.msg))
    for (std::size_t i = 0; i < d->overflow.size(); ++i)
      if (!d->overflow[i].inf && !d->overflow[i].nan)
        throw Bad("UnscaleDone.overflow[" + std::to_string(i) + "]: neither inf nor nan");
  if (auto* d = std::get_if<UnscaleDone>(&e.msg)) check_unscale_values(*d);
  if (auto* u = std::get_if<UpdateScale>(&e.msg)) check_count("UpdateScale", u->unscales);
  if (auto* c = std::get_if<IterationClosed>(&e.msg)) check_count("IterationClosed", c->unscales);
  if (is_keeper_input(e.msg) ? e.to != trace_keeper : e.from != trace_keeper)
    throw Bad(type + (is_keeper_input(e.msg) ? " must go to" : " must come from") + " \"keeper\"");
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
  read_message(e, type, raw, version);
  check_event(e, type);
  return e;
}

}  // namespace

// ---- reading ----
TraceError::TraceError(const std::string& source, std::size_t line, const std::string& problem)
    : ScalerError(errc::bad_trace, line ? source + ":" + std::to_string(line) + ": " + problem
                                        : source + ": " + problem),
      line_(line) {}

namespace {

/// The trailer of a version 3 trace: {"end":"ampactor","events":N}, N the events before it, and
/// "stopped": why, when a write failed and the recording stopped there. Returns that reason.
std::string read_trailer(const json& j, std::size_t events) {
  Reader r{j, "trailer"};
  std::string end, stopped;
  r("end", end);
  if (end != "ampactor") throw Bad("trailer.end: expected \"ampactor\", got \"" + end + "\"");
  std::int64_t n = -1;
  r.integer("events", n);
  if (j.contains("stopped")) r("stopped", stopped);
  r.done();
  if (n < 0 || std::size_t(n) != events)
    throw Bad("the trailer counts " + std::to_string(n) + " events, the trace holds " +
              std::to_string(events) + " (lines lost or added)");
  return stopped;
}

/// A trace's JSON nests a few levels (the header's rule options are the deepest); a line that
/// nests deeper is refused as it is parsed, before any deep value exists to print or destroy
/// recursively (a 170 KB line of brackets crashed the reader's error text).
constexpr int kMaxDepth = 32;

json parse_line(const std::string& text) {
  return json::parse(text, [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth)
      throw Bad("the JSON nests deeper than " + std::to_string(kMaxDepth) + " levels");
    return true;
  });
}

/// What parse_trace has read so far, besides the trace itself.
struct Progress {
  bool have_header = false;
  bool trailer_seen = false;
  OwnRanks own_ranks;
};

/// A parsed line into `t`: the header first, then the events, and from version 3 the trailer.
void add_line(const json& j, std::size_t line, Trace& t, Progress& p) {
  if (!p.have_header) {
    t.header = read_header(j);
    p.have_header = true;
    t.complete = t.header.version < 3;  // from version 3, complete once its trailer is read
  } else if (t.header.version >= 3 && j.is_object() && j.contains("end")) {
    const std::string stopped = read_trailer(j, t.events.size());
    p.trailer_seen = true;
    t.complete = stopped.empty();  // a recording whose writes failed ends early, saying so
    if (!stopped.empty()) t.stopped_at = line, t.stop_reason = stopped;
  } else {
    TraceEvent e = read_event(j, t.events.size(), t.header.version);
    if (const auto* d = std::get_if<UnscaleDone>(&e.msg)) p.own_ranks.check(*d);
    t.events.push_back(std::move(e));
    t.lines.push_back(line);
  }
}

/// Line `line`'s `text` into `t`; why it cannot be read, or nothing where it was.
std::optional<std::string> read_line(const std::string& text, std::size_t line, Trace& t,
                                     Progress& p) {
  try {
    add_line(parse_line(text), line, t, p);
    return std::nullopt;
  } catch (const json::parse_error& e) {
    return "not valid JSON (truncated or corrupt line): " + std::string(e.what());
  } catch (const Bad& b) {
    return std::string(b.what());
  } catch (const json::exception& e) {  // out_of_range for 1e309; a value of an unexpected type
    return std::string(e.what());
  }
}

}  // namespace

Trace parse_trace(std::istream& in, const std::string& source, bool prefix) {
  Trace t;
  Progress p;
  std::string text;
  std::size_t line = 0;
  bool blank_seen = false;
  std::size_t blank_line = 0;
  // A bad line ends the intact part when reading a prefix; the header must be whole either way.
  auto stop = [&](std::size_t at, const std::string& why) {
    if (!prefix || !p.have_header) throw TraceError(source, at, why);
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
    if (p.trailer_seen) {
      stop(line, "a line after the trailer");
      break;
    }
    if (const auto why = read_line(text, line, t, p)) {
      stop(line, *why);
      break;
    }
  }
  if (in.bad()) throw TraceError(source, line, "read error");
  if (!p.have_header) throw TraceError(source, 1, "empty trace: no header line");
  return t;
}

Trace read_trace(const std::string& path, bool prefix) {
  std::ifstream in(path);
  if (!in) throw TraceError(path, 0, std::string("cannot open: ") + std::strerror(errno));
  return parse_trace(in, path, prefix);
}

}  // namespace ampactor
