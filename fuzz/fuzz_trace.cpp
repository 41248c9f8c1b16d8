// libFuzzer target: the trace reader and replay. Any input is a trace file; the reader must
// either refuse it with a TraceError or read it, strictly and with --prefix consistently, and
// whatever it reads must replay and what-if without throwing. Anything else (a crash, an
// uncaught exception, a sanitizer report, a broken invariant) is a finding.
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_trace: invariant broken: %s\n", what);
  std::abort();
}

std::optional<ampactor::Trace> parse(const std::string& text, bool prefix, std::size_t& line) {
  std::istringstream in(text);
  try {
    return ampactor::parse_trace(in, "fuzz", prefix);
  } catch (const ampactor::TraceError& e) {
    line = e.line();
    return std::nullopt;
  }
}

void exercise(const ampactor::Trace& t) {
  const ampactor::ReplayResult r = ampactor::replay_trace(t);
  if (r.matched > t.events.size()) broken("replay matched more events than the trace holds");
  if (r.identical && r.matched != t.events.size()) broken("identical but not every event matched");
  // What-if under the recorded settings and under the other policy.
  ampactor::TraceHeader other = t.header;
  other.policy = other.policy == ampactor::ScalePolicy::exact ? ampactor::ScalePolicy::lagged
                                                              : ampactor::ScalePolicy::exact;
  for (const auto& settings : {t.header, other}) {
    const ampactor::WhatIfResult w = ampactor::what_if(t, settings);
    if (w.uncertain < 0 || std::size_t(w.uncertain) > w.rows.size())
      broken("what-if counts more uncertain rows than it has");
    (void)ampactor::what_if_csv(w);
    // Per layer: every overflowing iteration of a layer is still, unknown or past a halt.
    const ampactor::LayerReport l = ampactor::layer_overflows(t, &w);
    for (const auto& x : l.layers)
      if (x.still + x.unknown > x.iterations || x.inf + x.nan < x.iterations)
        broken("a layer's what-if counts exceed its overflowing iterations");
    (void)ampactor::layer_csv(l);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::size_t strict_line = 0, prefix_line = 0;
  const auto strict = parse(text, false, strict_line);
  const auto prefix = parse(text, true, prefix_line);
  // --prefix reads what the strict reader reads, and the part before the strict reader's error.
  if (strict) {
    if (!prefix) broken("--prefix refused a trace the strict reader read");
    if (prefix->events.size() != strict->events.size() || prefix->stopped_at != 0)
      broken("--prefix read a whole trace differently");
    exercise(*strict);
  } else if (prefix) {
    if (prefix->stopped_at != strict_line) broken("--prefix stopped elsewhere than the error");
    if (prefix->complete) broken("a trace cut by --prefix counts as complete");
    exercise(*prefix);
  } else if (prefix_line != strict_line) {
    broken("the two readers refused at different lines");
  }
  return 0;
}
