#include <ampactor/actors/trace.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

namespace ampactor {
namespace {

using nlohmann::json;
// Written in field order (seq first, as a reader scans it); read into the plain json.
using ojson = nlohmann::ordered_json;

// ---- the fields of each message, by name: one list serves writing and reading ----
template <class F>
void fields(F& f, ScaleRequest& x) {
  f("k", x.k);
}
template <class F>
void fields(F& f, ScaleReply& x) {
  f("k", x.k), f("scale", x.scale);
}
template <class F>
void fields(F& f, UnscaleDone& x) {
  f("k", x.k), f("optimizer", x.optimizer), f("found_inf", x.found_inf),
      f("scale_used", x.scale_used);
}
template <class F>
void fields(F& f, UpdateScale& x) {
  f("k", x.k), f("expected_unscales", x.expected_unscales), f("has_new_scale", x.has_new_scale),
      f("new_scale", x.new_scale);
}
template <class F>
void fields(F& f, IterationClosed& x) {
  f("k", x.k), f("unscales", x.unscales), f("abandoned", x.abandoned);
}
template <class F>
void fields(F& f, GetParams& x) {
  f("k", x.k), f("up_to_date", x.up_to_date);
}
template <class F>
void fields(F& f, SetParam& x) {
  f("k", x.k), f("which", x.which), f("value", x.value);
}
template <class F>
void fields(F& f, GetStateDict& x) {
  f("k", x.k);
}
template <class F>
void fields(F& f, StateDictMsg& x) {
  f("empty", x.empty), f("scale", x.scale), f("growth_factor", x.growth_factor),
      f("backoff_factor", x.backoff_factor), f("growth_interval", x.growth_interval),
      f("growth_tracker", x.growth_tracker);
}
template <class F>
void fields(F& f, LoadStateDict& x) {
  f("k", x.k), f("state", x.state);
}
template <class F>
void fields(F& f, TraceSubscribe& x) {
  f("subscriber", x.subscriber);
}
template <class F>
void fields(F& f, ScaleParams& x) {
  f("applied_through", x.applied_through), f("scale", x.scale), f("growth_factor", x.growth_factor),
      f("backoff_factor", x.backoff_factor), f("growth_interval", x.growth_interval),
      f("growth_tracker", x.growth_tracker);
}
template <class F>
void fields(F& f, UpdateApplied& x) {
  f("k", x.k), f("scale", x.scale), f("growth_tracker", x.growth_tracker),
      f("found_inf", x.found_inf), f("backed_off", x.backed_off), f("grew", x.grew),
      f("abandoned", x.abandoned);
}
template <class F>
void fields(F& f, TraceErrorReply& x) {
  f("code", x.code), f("what", x.what);
}

template <class T>
struct TypeName;
#define AMPACTOR_TRACE_NAME(T, name)           \
  template <>                                  \
  struct TypeName<T> {                         \
    static constexpr const char* value = name; \
  };
AMPACTOR_TRACE_NAME(ScaleRequest, "ScaleRequest")
AMPACTOR_TRACE_NAME(UnscaleDone, "UnscaleDone")
AMPACTOR_TRACE_NAME(UpdateScale, "UpdateScale")
AMPACTOR_TRACE_NAME(IterationClosed, "IterationClosed")
AMPACTOR_TRACE_NAME(GetParams, "GetParams")
AMPACTOR_TRACE_NAME(SetParam, "SetParam")
AMPACTOR_TRACE_NAME(GetStateDict, "GetStateDict")
AMPACTOR_TRACE_NAME(LoadStateDict, "LoadStateDict")
AMPACTOR_TRACE_NAME(TraceSubscribe, "Subscribe")
AMPACTOR_TRACE_NAME(ScaleReply, "ScaleReply")
AMPACTOR_TRACE_NAME(ScaleParams, "ScaleParams")
AMPACTOR_TRACE_NAME(StateDictMsg, "StateDict")
AMPACTOR_TRACE_NAME(UpdateApplied, "UpdateApplied")
AMPACTOR_TRACE_NAME(TraceErrorReply, "Error")
#undef AMPACTOR_TRACE_NAME

const char* param_name(Param p) {
  switch (p) {
    case Param::growth_factor:
      return "growth_factor";
    case Param::backoff_factor:
      return "backoff_factor";
    case Param::growth_interval:
      return "growth_interval";
  }
  return "?";
}

constexpr int errc_last = static_cast<int>(errc::iteration_open);

/// Numbers are written exactly (nlohmann prints the shortest text that reads back to the same
/// double; a float widens to double exactly); JSON has no inf/NaN, so those are strings.
ojson number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

struct Writer {
  ojson& j;
  void operator()(const char* name, bool v) { j[name] = v; }
  void operator()(const char* name, float v) { j[name] = number(v); }
  void operator()(const char* name, double v) { j[name] = number(v); }
  void operator()(const char* name, std::int32_t v) { j[name] = v; }
  void operator()(const char* name, std::int64_t v) { j[name] = v; }
  void operator()(const char* name, std::uint64_t v) { j[name] = v; }
  void operator()(const char* name, Param v) { j[name] = param_name(v); }
  void operator()(const char* name, errc v) { j[name] = to_string(v); }
  void operator()(const char* name, const std::string& v) { j[name] = v; }
  void operator()(const char* name, StateDictMsg v) {
    ojson sub = ojson::object();
    Writer w{sub};
    fields(w, v);
    j[name] = std::move(sub);
  }
};

/// The event writer of the recording path: appends JSON straight into a string, with nlohmann's
/// own number formatting (shortest round-trip text, ".0" on whole floats), so a line reads as a
/// json dump would, without building a json object per event (that cost ~3 us an event).
struct FastWriter {
  std::string& s;
  bool first = true;

  void key(const char* name) {
    s += first ? "\"" : ",\"";
    first = false;
    s += name;
    s += "\":";
  }
  template <class Int>
  void integer(Int v) {
    char buf[24];
    s.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  }
  void real(double v) {
    if (std::isnan(v)) {
      s += "\"nan\"";
    } else if (std::isinf(v)) {
      s += v > 0 ? "\"inf\"" : "\"-inf\"";
    } else {
      char buf[64];
      s.append(buf, nlohmann::detail::to_chars(buf, buf + sizeof buf, v));
    }
  }
  void string(const std::string& v) {
    s += '"';
    for (const char c : v) {
      switch (c) {
        case '"':
          s += "\\\"";
          break;
        case '\\':
          s += "\\\\";
          break;
        case '\n':
          s += "\\n";
          break;
        case '\r':
          s += "\\r";
          break;
        case '\t':
          s += "\\t";
          break;
        case '\b':
          s += "\\b";
          break;
        case '\f':
          s += "\\f";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
            s += buf;
          } else {
            s += c;
          }
      }
    }
    s += '"';
  }
  void operator()(const char* name, bool v) { key(name), s += v ? "true" : "false"; }
  void operator()(const char* name, float v) { key(name), real(v); }
  void operator()(const char* name, double v) { key(name), real(v); }
  void operator()(const char* name, std::int32_t v) { key(name), integer(v); }
  void operator()(const char* name, std::int64_t v) { key(name), integer(v); }
  void operator()(const char* name, std::uint64_t v) { key(name), integer(v); }
  void operator()(const char* name, Param v) { key(name), string(param_name(v)); }
  void operator()(const char* name, errc v) { key(name), string(to_string(v)); }
  void operator()(const char* name, const std::string& v) { key(name), string(v); }
  void operator()(const char* name, StateDictMsg v) {
    key(name);
    s += '{';
    FastWriter sub{s};
    fields(sub, v);
    s += '}';
  }
};

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
  void operator()(const char* name, Param& x) {
    const json& v = at(name);
    for (Param p : {Param::growth_factor, Param::backoff_factor, Param::growth_interval})
      if (v.is_string() && v.get_ref<const std::string&>() == param_name(p)) {
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

template <class T>
constexpr bool has_k(T*) {
  return !std::is_same_v<T, TraceSubscribe> && !std::is_same_v<T, ScaleParams> &&
         !std::is_same_v<T, StateDictMsg> && !std::is_same_v<T, TraceErrorReply>;
}

const char* policy_name(ScalePolicy p) {
  return p == ScalePolicy::lagged ? "lagged" : "exact";
}

// The options through their getters and their checked setters; the field names are the
// schema's.
void write_options(Writer& w, const GradScalerOptions& o) {
  w("init_scale", o.init_scale()), w("growth_factor", o.growth_factor()),
      w("backoff_factor", o.backoff_factor()), w("growth_interval", o.growth_interval()),
      w("enabled", o.enabled()), w("allow_fp16_grads", o.allow_fp16_grads());
}

// The header's options as read, before the setters check them.
struct OptionValues {
  double init_scale = 0, growth_factor = 0, backoff_factor = 0;
  std::int64_t growth_interval = 0;
  bool enabled = false, allow_fp16_grads = false;

  explicit OptionValues(Reader& r) {
    r("init_scale", init_scale), r("growth_factor", growth_factor),
        r("backoff_factor", backoff_factor), r("growth_interval", growth_interval),
        r("enabled", enabled), r("allow_fp16_grads", allow_fp16_grads);
  }
  /// Throws ScalerError for a value a setter refuses.
  GradScalerOptions options() const {
    return GradScalerOptions()
        .enabled(enabled)
        .allow_fp16_grads(allow_fp16_grads)
        .growth_factor(growth_factor)
        .backoff_factor(backoff_factor)
        .growth_interval(growth_interval)
        .init_scale(init_scale);
  }
};

TraceHeader read_header(const json& j) {
  if (!j.is_object()) throw Bad("the header must be a JSON object, got " + json_kind(j));
  auto t = j.find("trace");
  if (t == j.end() || !t->is_string() || *t != "ampactor")
    throw Bad("not an ampactor trace: the header needs \"trace\": \"ampactor\"");
  Reader r{j, "header"};
  r.seen.emplace_back("trace");
  std::int64_t version = 0;
  r.integer("version", version);
  if (version != trace_schema_version)
    throw Bad("unsupported trace schema version " + std::to_string(version) +
              " (this build reads version " + std::to_string(trace_schema_version) + ")");
  TraceHeader h;
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
  const OptionValues values(ro);
  ro.done();
  r.done();
  try {
    h.opts = values.options();
    h.opts.validate();
  } catch (const ScalerError& e) {
    throw Bad(std::string("header.options: ") + e.what());
  }
  return h;
}

TraceEvent read_event(const json& j, std::uint64_t expected_seq) {
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
  const json& msg = r.at("msg");
  if (!msg.is_object()) r.wrong("msg", msg, "an object");
  r.done();
  const Known* kind = nullptr;
  for (const auto& k : known)
    if (type == k.name) kind = &k;
  if (!kind) throw Bad("unknown message type \"" + type + "\" (known: " + known_list() + ")");
  e.msg = kind->read(msg);
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (has_k(static_cast<T*>(nullptr))) {
          if (m.k != e.k)
            throw Bad("event k " + std::to_string(e.k) + " differs from msg.k " +
                      std::to_string(m.k));
        }
      },
      e.msg);
  if (is_keeper_input(e.msg) ? e.to != trace_keeper : e.from != trace_keeper)
    throw Bad(type + (is_keeper_input(e.msg) ? " must go to" : " must come from") + " \"keeper\"");
  return e;
}

}  // namespace

const char* trace_type_name(const TraceMessage& m) {
  return std::visit([](const auto& x) { return TypeName<std::decay_t<decltype(x)>>::value; }, m);
}

bool is_keeper_input(const TraceMessage& m) {
  return m.index() <= std::size_t(8);  // the inputs come first in TraceMessage
}
static_assert(std::is_same_v<std::variant_alternative_t<8, TraceMessage>, TraceSubscribe>);
static_assert(std::is_same_v<std::variant_alternative_t<9, TraceMessage>, ScaleReply>);

std::string to_json_line(const TraceHeader& h) {
  ojson o = ojson::object();
  Writer w{o};
  write_options(w, h.opts);
  ojson j = {{"trace", "ampactor"},
             {"version", trace_schema_version},
             {"policy", policy_name(h.policy)},
             {"options", std::move(o)}};
  return j.dump();
}

namespace {
void append_event(std::string& out, const TraceEvent& e) {
  FastWriter w{out};
  w("seq", e.seq);
  w("k", e.k);
  w("from", e.from);
  w("to", e.to);
  w("type", std::string(trace_type_name(e.msg)));
  w.key("msg");
  out += '{';
  FastWriter m{out};
  std::visit([&](auto x) { fields(m, x); }, e.msg);
  out += "}}";
}
}  // namespace

std::string to_json_line(const TraceEvent& e) {
  std::string out = "{";
  append_event(out, e);
  return out;
}

// ---- TraceFile ----
TraceFile::TraceFile(const std::string& path) : path_(path), buf_(1 << 20) {
  // A large buffer: one write(2) per ~2000 iterations instead of one per ~16.
  out_.rdbuf()->pubsetbuf(buf_.data(), std::streamsize(buf_.size()));
  out_.open(path, std::ios::trunc);
  if (!out_)
    throw std::runtime_error("cannot open trace file " + path + ": " + std::strerror(errno));
}

TraceFile::~TraceFile() {
  close();
}

void TraceFile::write(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok_ || !out_.is_open()) return;
  out_ << line << '\n';
  if (!out_) ok_ = false;
}

void TraceFile::header(const TraceHeader& h) {
  write(to_json_line(h));
}
void TraceFile::event(const TraceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok_ || !out_.is_open()) return;
  line_.assign(1, '{');  // reused: no allocation per event once it has grown
  append_event(line_, e);
  line_ += '\n';
  out_.write(line_.data(), std::streamsize(line_.size()));
  if (!out_) ok_ = false;
}

bool TraceFile::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (out_.is_open()) {
    out_.flush();
    if (!out_) ok_ = false;
    out_.close();
  }
  return ok_;
}

bool TraceFile::ok() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ok_;
}

// ---- reading ----
TraceError::TraceError(const std::string& source, std::size_t line, const std::string& problem)
    : std::runtime_error(line ? source + ":" + std::to_string(line) + ": " + problem
                              : source + ": " + problem),
      line_(line) {}

Trace parse_trace(std::istream& in, const std::string& source) {
  Trace t;
  std::string text;
  std::size_t line = 0;
  bool have_header = false;
  bool blank_seen = false;
  std::size_t blank_line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) {
      if (!blank_seen) blank_line = line;
      blank_seen = true;
      continue;
    }
    if (blank_seen) throw TraceError(source, blank_line, "empty line inside the trace");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      throw TraceError(source, line,
                       "not valid JSON (truncated or corrupt line): " + std::string(e.what()));
    }
    try {
      if (!have_header) {
        t.header = read_header(j);
        have_header = true;
      } else {
        t.events.push_back(read_event(j, t.events.size()));
        t.lines.push_back(line);
      }
    } catch (const Bad& b) {
      throw TraceError(source, line, b.what());
    }
  }
  if (in.bad()) throw TraceError(source, line, "read error");
  if (!have_header) throw TraceError(source, 1, "empty trace: no header line");
  return t;
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw TraceError(path, 0, std::string("cannot open: ") + std::strerror(errno));
  return parse_trace(in, path);
}

}  // namespace ampactor
