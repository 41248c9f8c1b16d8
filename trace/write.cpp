// Writing traces: JSON Lines, one event a line, numbers exact.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>

#include "trace_fields.h"

namespace ampactor {
namespace {

using namespace trace_detail;
// Written in field order (seq first, as a reader scans it).
using ojson = nlohmann::ordered_json;

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
  void operator()(const char* name, errc v) { j[name] = to_string(v); }
  void operator()(const char* name, const std::string& v) { j[name] = v; }
  void operator()(const char* name, StateDictMsg v) {
    ojson sub = ojson::object();
    Writer w{sub};
    fields(w, v);
    j[name] = std::move(sub);
  }
};

/// The event writer of the recording path: appends JSON straight into a string (shortest
/// round-trip text for numbers, ".0" on whole ones so they read back as floats), without building
/// a json object per event (that cost ~3 us an event).
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
      char* end = std::to_chars(buf, buf + sizeof buf, v).ptr;
      // A whole number needs a mark that it is a float ("2" would read back as an integer).
      if (std::find_if(buf, end, [](char c) { return c == '.' || c == 'e'; }) == end)
        end = std::copy_n(".0", 2, end);
      s.append(buf, end);
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
  void operator()(const char* name, errc v) { key(name), string(to_string(v)); }
  void operator()(const char* name, const std::string& v) { key(name), string(v); }
  void operator()(const char* name, const std::vector<std::int32_t>& v) {
    key(name);
    s += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      integer(v[i]);
    }
    s += ']';
  }
  void operator()(const char* name, const std::vector<OverflowTensor>& v) {
    key(name);
    s += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      s += i ? ",{" : "{";
      FastWriter sub{s};
      OverflowTensor t = v[i];  // fields() takes what it writes by reference, as readers do
      fields(sub, t);
      s += '}';
    }
    s += ']';
  }
  void operator()(const char* name, StateDictMsg v) {
    key(name);
    s += '{';
    FastWriter sub{s};
    fields(sub, v);
    s += '}';
  }
};

}  // namespace

const char* trace_type_name(const TraceMessage& m) {
  return std::visit([](const auto& x) { return TypeName<std::decay_t<decltype(x)>>::value; }, m);
}

bool is_keeper_input(const TraceMessage& m) {
  return m.index() <= std::size_t(13);  // the inputs come first in TraceMessage
}
static_assert(std::is_same_v<std::variant_alternative_t<13, TraceMessage>, TraceUnsubscribe>);
static_assert(std::is_same_v<std::variant_alternative_t<14, TraceMessage>, ScaleReply>);

std::string to_json_line(const TraceHeader& h) {
  ojson o = ojson::object();
  Writer w{o};
  OptionValues(h.opts).apply(w);
  if (RuleValues rule(h.opts); rule.needed()) {
    ojson r = ojson::object();
    Writer wr{r};
    rule.apply(wr);
    o["rule"] = std::move(r);
  }
  if (GuardValues guard(h.opts); guard.needed()) {
    ojson g = ojson::object();
    Writer wg{g};
    guard.apply(wg);
    o["guard"] = std::move(g);
  }
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
struct TraceFile::State {
  explicit State(const TraceFileOptions& o, const std::string& p) : options(o), path(p) {}
  /// Hands the buffer to the kernel (a write(2), no fsync): what a crash of the process leaves.
  void flush_locked() {
    out.flush();
    if (!out) return failed_locked();
    flushed = std::chrono::steady_clock::now();
    good_bytes = out.tellp();
    good_events = events;
  }
  /// A write failed (errno says why): said once on stderr, the file cut back to its last whole
  /// flush with a trailer saying where and why the recording stopped, and closed.
  void failed_locked() {
    const int err = errno;
    ok = false;
    if (!failure.empty()) return;
    failure = "the trace " + path + " could not be written (" + std::strerror(err ? err : EIO) +
              "): it holds the first " + std::to_string(good_events) +
              " events; the recording stopped there";
    failed.store(true);
    std::cerr << "ampactor: " << failure << " (the training goes on)\n";
    out.clear();
    out.close();  // whatever it still holds goes or not: the file is cut back below
    if (::truncate(path.c_str(), off_t(good_bytes)) != 0 || good_bytes == 0) return;
    // The trailer, if it fits: a reader then knows the recording stopped and why.
    std::ofstream tail(path, std::ios::app);
    nlohmann::json j = {{"end", "ampactor"}, {"events", good_events}, {"stopped", failure}};
    tail << j.dump() << '\n';
    tail.flush();
    if (!tail) {
      tail.close();
      ::truncate(path.c_str(), off_t(good_bytes));  // no half trailer
    }
  }
  std::mutex mu;
  TraceFileOptions options;
  std::uint64_t events = 0;
  std::chrono::steady_clock::time_point flushed = std::chrono::steady_clock::now();
  std::string path;
  std::vector<char> buf = std::vector<char>(1 << 20);  // declared before the stream: outlives it
  std::ofstream out;
  std::string line;
  bool ok = true;
  std::streamoff good_bytes = 0;  // the file's length at the last successful flush
  std::uint64_t good_events = 0;  // the events it holds then
  std::string failure;            // why the recording stopped ("" while it records)
  std::atomic<bool> failed{false};
};

TraceFile::TraceFile(const std::string& path, const TraceFileOptions& options)
    : state_(std::make_unique<State>(options, path)) {
  State& s = *state_;
  // A large buffer: one write(2) per ~2000 iterations instead of one per ~16.
  s.out.rdbuf()->pubsetbuf(s.buf.data(), std::streamsize(s.buf.size()));
  s.out.open(path, std::ios::trunc);
  if (!s.out)
    throw ScalerError(errc::bad_trace,
                      "cannot open trace file " + path + ": " + std::strerror(errno));
}

TraceFile::~TraceFile() {
  close();
}

const std::string& TraceFile::path() const {
  return state_->path;
}

void TraceFile::header(const TraceHeader& h) {
  const std::string text = to_json_line(h);
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.ok || !s.out.is_open()) return;
  s.out << text << '\n';
  if (!s.out) return s.failed_locked();
  s.flush_locked();  // a file that exists has its header
}

void TraceFile::event(const TraceEvent& e) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.ok || !s.out.is_open()) return;
  s.line.assign(1, '{');  // reused: no allocation per event once it has grown
  append_event(s.line, e);
  s.line += '\n';
  s.out.write(s.line.data(), std::streamsize(s.line.size()));
  if (!s.out) return s.failed_locked();
  ++s.events;
  // An iteration ends with the keeper's UpdateApplied: hand the records to the kernel there, so a
  // killed process leaves whole iterations; and at least once a second for long ones.
  if ((s.options.flush_iterations() && std::holds_alternative<UpdateApplied>(e.msg)) ||
      std::chrono::steady_clock::now() - s.flushed > std::chrono::seconds(1))
    s.flush_locked();
}

bool TraceFile::close() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.out.is_open()) {
    if (s.ok) s.out << "{\"end\":\"ampactor\",\"events\":" << s.events << "}\n";  // complete
    s.out.flush();
    if (!s.out) return s.failed_locked(), false;
    s.out.close();
  }
  return s.ok;
}

std::string TraceFile::failure() const {
  if (!state_->failed.load()) return {};  // the keeper's thread writes: no lock while it records
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->failure;
}

bool TraceFile::ok() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->ok;
}

}  // namespace ampactor
