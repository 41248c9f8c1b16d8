// Writing traces: JSON Lines, one event a line, numbers exact.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

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
TraceFile::TraceFile(const std::string& path, const TraceFileOptions& options)
    : options_(options), path_(path), buf_(1 << 20) {
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

void TraceFile::flush_locked() {
  out_.flush();
  if (!out_) ok_ = false;
  flushed_ = std::chrono::steady_clock::now();
}

void TraceFile::header(const TraceHeader& h) {
  write(to_json_line(h));
  std::lock_guard<std::mutex> lock(mu_);
  if (ok_ && out_.is_open()) flush_locked();  // a file that exists has its header
}

void TraceFile::event(const TraceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok_ || !out_.is_open()) return;
  line_.assign(1, '{');  // reused: no allocation per event once it has grown
  append_event(line_, e);
  line_ += '\n';
  out_.write(line_.data(), std::streamsize(line_.size()));
  if (!out_) ok_ = false;
  ++events_;
  // An iteration ends with the keeper's UpdateApplied: hand the records to the kernel there, so a
  // killed process leaves whole iterations; and at least once a second for long ones.
  if ((options_.flush_iterations() && std::holds_alternative<UpdateApplied>(e.msg)) ||
      std::chrono::steady_clock::now() - flushed_ > std::chrono::seconds(1))
    flush_locked();
}

bool TraceFile::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (out_.is_open()) {
    if (ok_) out_ << "{\"end\":\"ampactor\",\"events\":" << events_ << "}\n";  // complete
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

}  // namespace ampactor
