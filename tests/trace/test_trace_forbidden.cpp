// Values the schema forbids (doc/reference/trace-format.md, Reading) are refused at their line,
// naming the field, and ampactor-replay exits 2 on them. The reproducers in traces/bad/ are
// collapse_guard_exact.jsonl's first 20 events with one such value each; before the reader
// checked them, each was read and replayed as identical (exit 0), or, under a version 6 header,
// diverged (exit 1).
#include "trace_fixture.h"

namespace {

/// traces/bad/`file` is refused at `line` with a text holding `says`, by the reader and by
/// ampactor-replay (exit 2).
void refused(const char* file, std::size_t line, const std::string& says) {
  const fs::path path = golden("bad") / file;
  try {
    read_trace(path.string());
    FAIL_CHECK("the trace was accepted");
  } catch (const TraceError& e) {
    CHECK(e.line() == line);
    CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
  }
  const fs::path out = scratch() / (std::string(file) + ".out");
  CHECK(run_replay(path.string(), out) == 2);
  CHECK_MESSAGE(slurp(out).find(says) != std::string::npos, slurp(out));
}

/// `file`'s line `line` (from 1) with `from` replaced by `to`: what reading it throws ("" when it
/// reads).
std::string edited(const std::string& file, std::size_t line, const std::string& from,
                   const std::string& to) {
  auto l = lines_of(slurp(fs::path(AMPACTOR_TRACES_DIR) / file));
  const auto at = l.at(line - 1).find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from);
  l[line - 1].replace(at, from.size(), to);
  std::istringstream in(join(l));
  try {
    parse_trace(in, file);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

// collapse_guard_exact.jsonl: line 14 is k 2's UnscaleDone and line 19 k 3's, each with
// "local_found_inf":true,...,"found_by":[1] (this rank, rank 1, found the overflow).
constexpr const char* guard_trace = "collapse_guard_exact.jsonl";

bool says(const std::string& error, const std::string& what) {
  return error.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("forbidden: found_by not ascending is refused naming found_by") {
  refused("found_by_unsorted.jsonl", 19, "UnscaleDone.found_by: expected ascending ranks");
  CHECK(says(edited(guard_trace, 19, "\"found_by\":[1]", "\"found_by\":[1,1]"),
             "UnscaleDone.found_by: expected ascending ranks, each once, got [1,1]"));
}

TEST_CASE("forbidden: a rank in found_by the optimizer's reports rule out is refused") {
  // [1000000] where this rank is rank 1: no world size is recorded, but rank 1's own report must
  // list rank 1.
  refused("found_by_rank_unknown.jsonl", 19, "UnscaleDone.found_by: no rank fits optimizer 1");
  // Its own rank listed although its own check found nothing.
  CHECK(says(edited(guard_trace, 19, "\"local_found_inf\":true", "\"local_found_inf\":false"),
             "UnscaleDone.found_by: no rank fits optimizer 1"));
  // Other ranks besides its own: the reports agree.
  CHECK(edited(guard_trace, 19, "\"found_by\":[1]", "\"found_by\":[0,1,7]").empty());
}

TEST_CASE("forbidden: a negative unscale count is refused naming the field") {
  refused("unscales_negative.jsonl", 20, "UpdateScale.unscales: expected a count >= 0, got -1");
  // IterationClosed counts unscales too.
  const auto l = lines_of(slurp(golden("setters_state_exact.jsonl")));
  std::size_t i = 0;
  while (l.at(i).find("\"type\":\"IterationClosed\"") == std::string::npos)
    ++i;
  const auto at = l[i].find("\"unscales\":");
  REQUIRE(at != std::string::npos);
  const std::string count = l[i].substr(at, l[i].find_first_of(",}", at) - at);
  CHECK(says(edited("setters_state_exact.jsonl", i + 1, count, "\"unscales\":-2"),
             "IterationClosed.unscales: expected a count >= 0, got -2"));
}

TEST_CASE("forbidden: a scale_used that is not a finite float >= 0 is refused naming the field") {
  refused("scale_used_nan.jsonl", 19, "UnscaleDone.scale_used: expected a finite scale >= 0");
  for (const char* v : {"\"inf\"", "\"-inf\"", "-4.0", "1e39" /* inf as a float */}) {
    CAPTURE(v);
    CHECK(says(edited(guard_trace, 19, "\"scale_used\":4.0", std::string("\"scale_used\":") + v),
               "UnscaleDone.scale_used: expected a finite scale >= 0"));
  }
  // torch's rule backs off to 0 after enough overflows: a recorded scale.
  CHECK(edited(guard_trace, 19, "\"scale_used\":4.0", "\"scale_used\":0.0").empty());
}

TEST_CASE("forbidden: an overflow index no parameter can have is refused naming the field") {
  refused("overflow_index_2e63.jsonl", 19,
          "UnscaleDone.overflow[0].index: expected a parameter's position (below 2^63 - 1), got "
          "9223372036854775808");
  CHECK(says(edited(guard_trace, 19, "\"index\":4", "\"index\":18446744073709551615"),
             "UnscaleDone.overflow[0].index"));
  CHECK(edited(guard_trace, 19, "\"index\":4", "\"index\":9223372036854775806").empty());
}

TEST_CASE("forbidden: a field newer than the header's version is refused, not replayed") {
  // Version 7's lines under a version 6 header: the first ScaleReply's guard fields.
  refused("v6_header_v7_fields.jsonl", 3,
          "ScaleReply: unknown field \"backoffs_in_row\" in a version 6 trace (since version 7)");
  // Each version's own fields in a file of the version before.
  CHECK(says(edited("v6/overflow_exact.jsonl", 1, "\"version\":6", "\"version\":5"),
             "unknown field \"local_found_inf\" in a version 5 trace (since version 6)"));
  CHECK(says(edited("v5/overflow_exact.jsonl", 1, "\"version\":5", "\"version\":4"),
             "unknown field \"grad_max\" in a version 4 trace (since version 5)"));
  CHECK(says(edited("v4/setters_state_exact.jsonl", 1, "\"version\":4", "\"version\":3"),
             "in a version 3 trace (since version 4)"));
  CHECK(says(edited("v4/deepspeed_rule_exact.jsonl", 1, "\"version\":4", "\"version\":3"),
             "header.options: unknown field \"rule\" (since version 4)"));
}
