// The trace reader's JSON checks, shared by read.cpp (the current schema), read_header.cpp (the
// header line) and read_old.cpp (older versions brought up to date). Internal to the trace library.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trace_fields.h"

namespace ampactor::trace_detail {

using nlohmann::json;

/// A problem on the line being read (the reader adds file and line).
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string json_kind(const json& v) {
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
  void operator()(const char* name, std::vector<std::int32_t>& x) {
    const json& v = at(name);
    if (!v.is_array()) wrong(name, v, "an array of integers");
    x.clear();
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<std::int64_t>() < 0 ||
          e.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
        wrong(name, v, "an array of ranks (integers >= 0)");
      x.push_back(std::int32_t(e.get<std::int64_t>()));
    }
  }
  void operator()(const char* name, std::vector<OverflowTensor>& x) {
    const json& v = at(name);
    if (!v.is_array()) wrong(name, v, "an array of objects");
    x.clear();
    for (const json& e : v) {
      if (!e.is_object()) wrong(name, v, "an array of objects");
      Reader sub{e, where + "." + name + "[" + std::to_string(x.size()) + "]"};
      OverflowTensor t;
      fields(sub, t);
      sub.done();
      x.push_back(std::move(t));
    }
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

/// A trace's header line: "trace": "ampactor", a schema version this build reads, the policy and
/// the scaler's options, refused as the scaler refuses them (read_header.cpp).
TraceHeader read_header(const json& j);

/// A version 1 message that version 2 replaced, as its version 2 value (nullopt: not one).
std::optional<TraceMessage> read_v1(const std::string& type, const json& j);

/// A version 1 to 6 message with version 7's fields (read_old.cpp says which).
json upgrade_old(const std::string& type, const json& msg, int version);

}  // namespace ampactor::trace_detail
