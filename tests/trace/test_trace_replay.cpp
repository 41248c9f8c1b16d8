// Traces: replay, what-if, ampactor-replay, and recording through the facade.
#include "trace_fixture.h"

#include <sstream>

TEST_CASE("replay finds the first divergence: a changed reply, a missing event, an extra one") {
  const Trace t = read_trace(golden("overflow_exact.jsonl").string());
  SUBCASE("a reply with another scale") {
    Trace bad = t;
    std::size_t i = 0;
    while (!std::holds_alternative<UpdateApplied>(bad.events[i].msg) ||
           !std::get<UpdateApplied>(bad.events[i].msg).backed_off)
      ++i;
    auto& a = std::get<UpdateApplied>(bad.events[i].msg);
    const float recorded = a.scale;
    a.scale *= 2;
    const ReplayResult r = replay_trace(bad);
    CHECK_FALSE(r.identical);
    CHECK(r.matched == i);
    CHECK(r.line == t.lines[i]);
    CHECK(r.expected == to_json_line(bad.events[i]));
    CHECK(r.got == to_json_line(t.events[i]));
    CHECK(std::get<UpdateApplied>(t.events[i].msg).scale == recorded);
  }
  SUBCASE("the trace ends early: the keeper does more") {
    Trace bad = t;
    bad.events.pop_back();
    bad.lines.pop_back();
    const ReplayResult r = replay_trace(bad);
    CHECK_FALSE(r.identical);
    CHECK(r.line == t.lines.back());
    CHECK(r.expected.empty());
    CHECK(r.got == to_json_line(t.events.back()));
  }
  SUBCASE("a recorded reply the keeper does not give") {
    Trace bad = t;
    TraceEvent extra = bad.events.back();
    extra.seq += 1;
    bad.events.push_back(extra);
    bad.lines.push_back(bad.lines.back() + 1);
    const ReplayResult r = replay_trace(bad);
    CHECK_FALSE(r.identical);
    CHECK(r.matched == t.events.size());
    CHECK(r.expected == to_json_line(extra));
    CHECK(r.got.empty());
  }
}

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

TEST_CASE("what-if: the recorded settings give the recorded trajectory") {
  for (const char* file : {"overflow_exact.jsonl", "two_optimizers_lagged.jsonl"}) {
    CAPTURE(file);
    const Trace t = read_trace(golden(file).string());
    const WhatIfResult w = what_if(t, t.header);
    REQUIRE(!w.rows.empty());
    for (const auto& row : w.rows) {
      CAPTURE(row.k);
      CHECK(row.whatif_scale == row.recorded_scale);
      CHECK(row.whatif_backoff == row.recorded_backoff);
    }
    CHECK(w.whatif.backoffs == w.recorded.backoffs);
    CHECK(w.whatif.skips == w.recorded.skips);
    CHECK(w.uncertain == 0);
  }
}

TEST_CASE("what-if: another growth interval under exact follows the thread-free rule") {
  const Trace t = read_trace(golden("overflow_exact.jsonl").string());
  TraceHeader other = t.header;
  other.opts.growth_interval(1);
  const WhatIfResult w = what_if(t, other);
  ScaleState ref(other.opts);
  ref.lazy_init();
  std::int64_t backoffs = 0, skips = 0;
  for (const auto& row : w.rows) {
    CAPTURE(row.k);
    CHECK(row.whatif_scale == ref.scale());
    // The what-if found_inf: predicted from the recorded sizes where the scale grew past them.
    backoffs += ref.update(row.whatif_found_inf).backed_off;
    skips += row.whatif_found_inf;
  }
  CHECK(w.whatif.backoffs == backoffs);
  CHECK(w.whatif.final_scale == double(ref.scale()));
  CHECK(w.whatif.growths > w.recorded.growths);
  CHECK(w.whatif.skips == skips);
  // the CSV has a header and one row per iteration
  CHECK(lines_of(what_if_csv(w)).size() == w.rows.size() + 1);
}

TEST_CASE("what-if: the lagged policy answers one iteration late") {
  const Trace t = read_trace(golden("overflow_exact.jsonl").string());
  TraceHeader lagged = t.header;
  lagged.policy = ScalePolicy::lagged;
  const WhatIfResult w = what_if(t, lagged);
  REQUIRE(w.rows.size() > 3);
  // The scale of iteration k+1 was given before update k was applied: it is the scale iteration k
  // used, changed at most by update k-1.
  const auto exact = what_if(t, t.header);
  CHECK(w.rows[0].whatif_scale == exact.rows[0].whatif_scale);
  CHECK(w.rows[1].whatif_scale == w.rows[0].whatif_scale);
  // Without the sizes (the version 4 file), found_inf is the recorded sequence, and the lagged
  // policy's one backoff per overflow event backs off no more often than exact.
  const Trace v4 = read_trace((fs::path(AMPACTOR_TRACES_DIR) / "v4/overflow_exact.jsonl").string());
  const WhatIfResult w4 = what_if(v4, lagged);
  CHECK(w4.whatif.skips == w4.recorded.skips);
  CHECK(w4.whatif.backoffs <= w4.recorded.backoffs);
}

TEST_CASE("ampactor-replay: exit codes, the first divergence, bad traces change nothing") {
  const fs::path out = scratch() / "replay.out";
  const fs::path csv = scratch() / "whatif.csv";
  CHECK(run_replay(golden("setters_state_exact.jsonl").string(), out) == 0);
  CHECK(slurp(out).find("identical") != std::string::npos);

  auto l = lines_of(slurp(golden("overflow_exact.jsonl")));
  std::size_t i = 1;
  while (l[i].find("\"type\":\"ScaleReply\"") == std::string::npos)
    ++i;
  const auto at = l[i].find("\"scale\":");
  REQUIRE(at != std::string::npos);
  l[i].replace(at, 8, "\"scale\":3");  // 1024.0 -> 31024.0
  const fs::path changed = scratch() / "changed.jsonl";
  write(changed, join(l));
  CHECK(run_replay(changed.string(), out) == 1);
  const std::string said = slurp(out);
  CHECK(said.find(":" + std::to_string(i + 1) + ": first divergence") != std::string::npos);
  CHECK(said.find("expected: ") != std::string::npos);
  CHECK(said.find("got: ") != std::string::npos);

  const fs::path truncated = scratch() / "truncated.jsonl";
  write(truncated, slurp(golden("overflow_exact.jsonl")).substr(0, 700));
  fs::remove(csv);
  CHECK(run_replay(truncated.string() + " --policy lagged --csv " + csv.string(), out) == 2);
  CHECK(slurp(out).find("not valid JSON") != std::string::npos);
  CHECK_FALSE(fs::exists(csv));
  CHECK(run_replay((scratch() / "missing.jsonl").string(), out) == 2);

  CHECK(run_replay(golden("overflow_exact.jsonl").string() +
                       " --policy lagged --growth-interval 2 -q --csv " + csv.string(),
                   out) == 0);
  CHECK(slurp(out).find("backoffs") != std::string::npos);
  CHECK(fs::exists(csv));
}

TEST_CASE("GradScaler with a trace recorder records a run that replays identically") {
  const fs::path path = scratch() / "facade.jsonl";
  const auto o = GradScalerOptions().init_scale(4096).growth_interval(2);
  test::Workload w;
  {
    auto recorder = record_trace(path.string());
    GradScaler scaler(o, KeeperOptions().tap(recorder));
    CHECK(scaler.tap() == recorder);
    test::Net a, b;
    for (iteration_t k = 0; k < 40; ++k) {
      scaler.scale(at::ones({1}));
      const float s = float(scaler.get_scale());
      auto g = w.grads(k, s);
      if (k % 2) {
        a.set_grads(g);
        b.set_grads(w.grads(k + 1000, s));
        scaler.step(*a.opt);
        scaler.step(*b.opt);
      } else {
        scaler.submit([&a, &b, &scaler, g, gb = w.grads(k + 1000, s)] {
          a.set_grads(g);
          b.set_grads(gb);
          scaler.step(*a.opt);
          scaler.step(*b.opt);
        });
      }
      scaler.update();
      if (k == 10) scaler.set_growth_interval(3);
      if (k == 20) CHECK(scaler.get_growth_interval(true) == 3);
      if (k == 30) scaler.load_state_dict(scaler.state_dict());
    }
  }
  const Trace t = read_trace(path.string());
  CHECK(t.header.opts.init_scale() == o.init_scale());
  CHECK(t.header.opts.growth_interval() == o.growth_interval());
  const ReplayResult r = replay_trace(t);
  CHECK(r.identical);
  CHECK(r.matched == t.events.size());
  const auto applied = all_of<UpdateApplied>(t);
  CHECK(applied.size() == 40);
  std::set<optimizer_id> ids;
  for (const auto& d : all_of<UnscaleDone>(t))
    ids.insert(d.optimizer);
  CHECK(ids == std::set<optimizer_id>{1, 2});
  CHECK(all_of<SetGrowthInterval>(t).size() == 1);
  CHECK(all_of<LoadStateDict>(t).size() == 1);
  bool overflow = false;
  for (const auto& a : applied)
    overflow |= a.backed_off;
  CHECK(overflow);
}

TEST_CASE("counted step jobs that fail short of their unscale record and replay identically") {
  const fs::path path = scratch() / "counted.jsonl";
  const auto o = GradScalerOptions().init_scale(4096).growth_interval(2);
  test::Workload w;
  int errors = 0;
  {
    GradScaler scaler(o, KeeperOptions().tap(record_trace(path.string())));
    test::Net a;
    for (iteration_t k = 0; k < 16; ++k) {
      try {
        scaler.scale(at::ones({1}));
        const float s = float(scaler.get_scale());
        scaler.submit(
            [&a, &scaler, g = w.grads(k, s), k] {
              if (k % 4 == 2) throw std::runtime_error("the move failed");
              a.set_grads(g);
              scaler.step(*a.opt);
            },
            SubmitOptions().unscales(UnscalePermit::exactly(1)));
        scaler.update();
      } catch (const std::runtime_error&) {
        ++errors;
      }
    }
    try {
      scaler.sync();
    } catch (const std::runtime_error&) {
      ++errors;
    }
  }
  CHECK(errors == 4);
  const Trace t = read_trace(path.string());
  const ReplayResult r = replay_trace(t);
  CHECK(r.identical);
  CHECK(r.matched == t.events.size());
  const auto closed = all_of<IterationClosed>(t);
  REQUIRE(closed.size() == 4);
  for (const auto& c : closed) {
    CHECK(c.abandoned);
    CHECK(c.k % 4 == 2);
  }
  int abandoned = 0;
  for (const auto& u : all_of<UpdateApplied>(t))
    abandoned += u.abandoned;
  CHECK(abandoned == 4);
  CHECK(all_of<UpdateApplied>(t).size() == 16);
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

TEST_CASE("record_trace refuses a path it cannot create") {
  CHECK_THROWS_AS(record_trace((scratch() / "no-such-dir" / "t.jsonl").string()),
                  std::runtime_error);
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
