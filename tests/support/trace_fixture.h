// Includes and helpers shared by the trace tests.
// Keeper traces: what the keeper records and in which order, the JSON Lines form, validation of
// bad traces, exact replay of the golden traces, what-if replay, ampactor-replay's exit codes, and
// a trace recorded by the GradScaler facade with real threads.
#pragma once
#include "doctest_torch.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <ATen/ops/ones.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "golden_traces.h"
#include "remove_tree.h"
#include "workload.h"

using namespace ampactor;
namespace fs = std::filesystem;

namespace {

[[maybe_unused]] std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream o;
  o << in.rdbuf();
  return o.str();
}

inline void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

inline std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines)
    s += l + "\n";
  return s;
}

/// A scratch directory of this process, removed at exit (by remove_tree: see there why).
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("ampactor-trace-test-" + std::to_string(getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { ampactor::test::remove_tree(dir.string()); }
};
[[maybe_unused]] const fs::path& scratch() {
  static Scratch s;
  return s.dir;
}

[[maybe_unused]] fs::path golden(const char* name) {
  return fs::path(AMPACTOR_TRACES_DIR) / name;
}

/// The message of the TraceError reading `text` throws.
inline TraceError read_error(const std::string& text) {
  std::istringstream in(text);
  try {
    parse_trace(in, "t");
  } catch (const TraceError& e) {
    return e;
  }
  FAIL("the trace was accepted");
  return TraceError("", 0, "");
}

template <class T>
std::vector<T> all_of(const Trace& t) {
  std::vector<T> out;
  for (const auto& e : t.events)
    if (auto* m = std::get_if<T>(&e.msg)) out.push_back(*m);
  return out;
}

inline int run_replay(const std::string& args, const fs::path& out) {
  const std::string cmd =
      std::string(AMPACTOR_REPLAY_EXE) + " " + args + " > " + out.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

struct ThrowingSink : TraceSink {
  int calls = 0;
  void header(const TraceHeader&) override {}
  void event(const TraceEvent&) override {
    ++calls;
    throw std::runtime_error("disk full");
  }
};

}  // namespace
