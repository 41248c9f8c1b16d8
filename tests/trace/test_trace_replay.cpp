// Traces: replay, what-if, ampactor-replay, and recording through the facade (reading bad and cut
// traces: test_trace_read.cpp).
#include "trace_fixture.h"

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

TEST_CASE("record_trace refuses a path it cannot create") {
  CHECK_THROWS_AS(record_trace((scratch() / "no-such-dir" / "t.jsonl").string()),
                  std::runtime_error);
}
