// Traces read back: bad traces refused with their line number (numbers out of range, deep
// nesting, every kind of malformed line), and the trailer of a complete trace.
#include "trace_fixture.h"

#include <sstream>

TEST_CASE("a number beyond double's range is a bad trace at its line, not an abort") {
  // tests/traces/bad/number_overflow.jsonl: a ScaleReply with scale 1e309 on line 4.
  try {
    read_trace((golden("bad") / "number_overflow.jsonl").string());
    FAIL("read");
  } catch (const TraceError& e) {
    CHECK(e.line() == 4);
    CHECK(std::string(e.what()).find("number overflow") != std::string::npos);
  }
}

TEST_CASE("bad traces: a clear error with the line number") {
  const std::vector<std::string> good = lines_of(slurp(golden("two_optimizers_lagged.jsonl")));
  REQUIRE(good.size() > 10);
  auto with = [&](std::size_t i, const std::string& from, const std::string& to) {
    auto l = good;
    const auto at = l[i].find(from);
    REQUIRE(at != std::string::npos);
    l[i].replace(at, from.size(), to);
    return join(l);
  };
  SUBCASE("truncated line") {
    auto l = good;
    l.back() = l.back().substr(0, l.back().size() / 2);
    const TraceError e = read_error(join(l));
    CHECK(e.line() == good.size());
    CHECK(std::string(e.what()).find("not valid JSON") != std::string::npos);
  }
  SUBCASE("unknown message type") {
    const TraceError e = read_error(with(1, "\"type\":\"ScaleRequest\"", "\"type\":\"Scale\""));
    CHECK(e.line() == 2);
    CHECK(std::string(e.what()).find("unknown message type \"Scale\"") != std::string::npos);
  }
  SUBCASE("wrong field type") {
    std::size_t i = 0;
    while (good[i].find("\"found_inf\":false") == std::string::npos)
      ++i;
    const TraceError e = read_error(with(i, "\"found_inf\":false", "\"found_inf\":0"));
    CHECK(e.line() == i + 1);
    CHECK(std::string(e.what()).find("found_inf: expected a boolean, got an integer") !=
          std::string::npos);
  }
  SUBCASE("a float where an integer belongs") {
    const TraceError e = read_error(with(1, "\"k\":0,", "\"k\":0.5,"));
    CHECK(e.line() == 2);
    CHECK(std::string(e.what()).find("expected an integer") != std::string::npos);
  }
  SUBCASE("out-of-order sequence numbers") {
    auto l = good;
    std::swap(l[4], l[5]);
    const TraceError e = read_error(join(l));
    CHECK(e.line() == 5);
    CHECK(std::string(e.what()).find("out of order (expected 3)") != std::string::npos);
  }
  SUBCASE("empty file") {
    const TraceError e = read_error("");
    CHECK(e.line() == 1);
    CHECK(std::string(e.what()).find("empty trace") != std::string::npos);
  }
  SUBCASE("missing file") {
    try {
      read_trace((scratch() / "no-such-trace.jsonl").string());
      FAIL("read a missing file");
    } catch (const TraceError& e) {
      CHECK(e.line() == 0);
      CHECK(std::string(e.what()).find("cannot open") != std::string::npos);
    }
  }
  SUBCASE("unsupported schema version") {
    const TraceError e = read_error(with(0, "\"version\":7", "\"version\":8"));
    CHECK(e.line() == 1);
    CHECK(std::string(e.what()).find("unsupported trace schema version 8") != std::string::npos);
  }
  SUBCASE("a version 2 message in a version 1 trace") {
    // Version 2's own lines: version 7's are refused first, at a field version 1 had not.
    auto v2 = lines_of(slurp(golden("v2/two_optimizers_lagged.jsonl")));
    v2[0].replace(v2[0].find("\"version\":2"), 11, "\"version\":1");
    const TraceError e = read_error(join(v2));
    CHECK(e.line() > 1);
    CHECK(std::string(e.what()).find("UpdateScale") != std::string::npos);
    CHECK(std::string(read_error(with(0, "\"version\":7", "\"version\":1")).what())
              .find("in a version 1 trace (since version 7)") != std::string::npos);
  }
  SUBCASE("a rank's own found_inf without the agreed one") {
    std::size_t i = 0;
    while (good[i].find("\"local_found_inf\":false") == std::string::npos)
      ++i;
    const TraceError e =
        read_error(with(i, "\"local_found_inf\":false", "\"local_found_inf\":true"));
    CHECK(e.line() == i + 1);
    CHECK(std::string(e.what()).find("local_found_inf without found_inf") != std::string::npos);
  }
  SUBCASE("header options a keeper refuses") {
    const TraceError e = read_error(with(0, "\"growth_factor\":2.0", "\"growth_factor\":0.5"));
    CHECK(e.line() == 1);
    CHECK(std::string(e.what()).find("growth factor") != std::string::npos);
  }
  SUBCASE("an unknown field") {
    const TraceError e = read_error(with(2, "\"seq\":", "\"color\":1,\"seq\":"));
    CHECK(e.line() == 3);
    CHECK(std::string(e.what()).find("unknown field \"color\"") != std::string::npos);
  }
  SUBCASE("a reply recorded as sent to the keeper") {
    const TraceError e = read_error(with(2, "\"from\":\"keeper\"", "\"from\":\"trainer1\""));
    CHECK(e.line() == 3);
    CHECK(std::string(e.what()).find("must come from \"keeper\"") != std::string::npos);
  }
  SUBCASE("an empty line inside") {
    auto l = good;
    l.insert(l.begin() + 3, "");
    const TraceError e = read_error(join(l));
    CHECK(e.line() == 4);
  }
}

TEST_CASE("a line that nests deeply is refused with its line number, not a crash") {
  const std::vector<std::string> good = lines_of(slurp(golden("overflow_exact.jsonl")));
  const std::string deep = std::string(85000, '[') + std::string(85000, ']');
  for (std::size_t at : {std::size_t(0), std::size_t(1)}) {  // in the header, in a message
    CAPTURE(at);
    std::vector<std::string> bad = good;
    const std::size_t brace = bad[at].rfind('}');
    bad[at] = bad[at].substr(0, brace) + ",\"extra\":" + deep + "}";
    std::istringstream in(join(bad));
    try {
      parse_trace(in, "deep.jsonl");
      FAIL("a trace nested 85000 levels deep was read");
    } catch (const TraceError& e) {
      CHECK(e.line() == at + 1);
      CHECK(std::string(e.what()).find("nests deeper than") != std::string::npos);
    }
  }
}

TEST_CASE("the trailer: a complete trace has it, a cut one does not and says so") {
  const std::vector<std::string> good = lines_of(slurp(golden("overflow_exact.jsonl")));
  REQUIRE(good.back().find("\"end\":\"ampactor\"") != std::string::npos);
  auto parse = [](const std::vector<std::string>& l, bool prefix = false) {
    std::istringstream in(join(l));
    return parse_trace(in, "t", prefix);
  };
  SUBCASE("whole: complete, identical") {
    const Trace t = parse(good);
    CHECK(t.complete);
    CHECK(replay_trace(t).identical);
  }
  SUBCASE("cut at a line boundary: incomplete, identical as far as it goes") {
    for (std::size_t keep : {std::size_t(2), good.size() / 2, good.size() - 1}) {
      CAPTURE(keep);
      const Trace t = parse({good.begin(), good.begin() + std::ptrdiff_t(keep)});
      CHECK_FALSE(t.complete);
      CHECK(t.events.size() == keep - 1);
      CHECK(replay_trace(t).identical);
    }
  }
  SUBCASE("a trailer that counts other events than the trace holds") {
    auto l = good;
    l.erase(l.end() - 2);  // the last event lost: the sequence numbers still run on
    CHECK_THROWS_WITH_AS(parse(l), doctest::Contains("the trailer counts"), TraceError);
  }
  SUBCASE("a line after the trailer") {
    auto l = good;
    l.push_back(good[1]);
    CHECK_THROWS_WITH_AS(parse(l), doctest::Contains("a line after the trailer"), TraceError);
  }
  SUBCASE("damage in the middle: refused whole, its intact part read with prefix") {
    auto l = good;
    const std::size_t bad = good.size() / 2;
    l[bad] = l[bad].substr(0, 10);
    CHECK_THROWS_AS(parse(l), TraceError);
    const Trace t = parse(l, true);
    CHECK_FALSE(t.complete);
    CHECK(t.stopped_at == bad + 1);  // 1-based line
    CHECK(t.stop_reason.find("not valid JSON") != std::string::npos);
    CHECK(t.events.size() == bad - 1);
    CHECK(replay_trace(t).identical);
  }
}
