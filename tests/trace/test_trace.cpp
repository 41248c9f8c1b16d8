// Traces: recording, writing and reading back, the golden traces.
#include "trace_fixture.h"

TEST_CASE("the keeper records inputs, replies and updates in mailbox order with stable names") {
  auto buf = std::make_shared<TraceBuffer>();
  const auto o = GradScalerOptions().init_scale(64).growth_interval(1);
  test::GoldenRig r(o, ScalePolicy::exact, buf);
  r.send(r.trainer, ScaleRequest{0});
  r.anon(UpdateScale{0, 1});
  r.send(r.trainer, ScaleRequest{1});  // waits for update 0
  r.report(r.opt1, 0, 0xdeadbeef, false);
  r.send(r.opt2, UnscaleDone{1, 0xfeed, true, 1.0f});

  CHECK(r.header.opts.init_scale() == 64.0);
  CHECK(r.header.policy == ScalePolicy::exact);
  const auto& ev = r.rig.events();
  REQUIRE(ev.size() == 8);
  for (std::size_t i = 0; i < ev.size(); ++i)
    CHECK(ev[i].seq == i);
  const std::vector<std::string> types = {"ScaleRequest", "ScaleReply",  "UpdateScale",
                                          "ScaleRequest", "UnscaleDone", "UpdateApplied",
                                          "ScaleReply",   "UnscaleDone"};
  for (std::size_t i = 0; i < ev.size(); ++i)
    CHECK(trace_type_name(ev[i].msg) == types[i]);
  CHECK(ev[0].from == "trainer1");
  CHECK(ev[1].to == "trainer1");
  CHECK(ev[2].from == trace_anonymous);
  CHECK(ev[4].from == "optimizer1");
  CHECK(ev[5].to == trace_subscribers);
  CHECK(ev[7].from == "optimizer2");
  // the deferred reply is recorded when delivered, with what the trainer received
  CHECK(ev[6].k == 1);
  CHECK(std::get<ScaleReply>(ev[6].msg).scale == r.scale_of.at(1));
  CHECK(std::get<ScaleReply>(ev[1].msg).scale == r.scale_of.at(0));
  // optimizers are numbered by first appearance, not by address
  CHECK(std::get<UnscaleDone>(ev[4].msg).optimizer == 1);
  CHECK(std::get<UnscaleDone>(ev[7].msg).optimizer == 2);
}

TEST_CASE("a refused setter is recorded as an Error reply and changes nothing") {
  auto buf = std::make_shared<TraceBuffer>();
  test::GoldenRig r(GradScalerOptions{}, ScalePolicy::exact, buf);
  r.send(r.trainer, SetBackoffFactor{1.5});
  r.send(r.trainer, GetParams{true});
  REQUIRE(r.rig.events().size() == 4);
  auto* err = std::get_if<TraceErrorReply>(&r.rig.events()[1].msg);
  REQUIRE(err);
  std::string expected_text;
  try {
    check_backoff_factor(1.5);
  } catch (const ScalerError& e) {
    CHECK(err->code == e.code());
    expected_text = e.what();
  }
  CHECK(err->what == expected_text);
  CHECK(r.rig.events()[1].to == "trainer1");
  CHECK(std::get<ScaleParams>(r.rig.events()[3].msg).backoff_factor ==
        GradScalerOptions{}.backoff_factor());
}

TEST_CASE("a sink that throws stops recording and the keeper goes on") {
  auto sink = std::make_shared<ThrowingSink>();
  KeeperCore core(GradScalerOptions{}, ScalePolicy::exact, std::make_shared<TraceRecorder>(sink));
  const auto first = core.handle(1, ScaleRequest{0}, 1);
  const auto second = core.handle(1, GetParams{false}, 2);
  CHECK(sink->calls == 1);  // the tap is dropped at its first throw
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(std::holds_alternative<ScaleReply>(std::get<KeeperReply>(first[0]).msg));
  CHECK(std::holds_alternative<ScaleParams>(std::get<KeeperReply>(second[0]).msg));
}

TEST_CASE("every message type writes and reads back exactly") {
  TraceHeader h;
  h.opts.init_scale(0.1).growth_interval(7);
  h.policy = ScalePolicy::lagged;
  StateDictMsg sd{false, 1e-300, 2.5, 0.125, 3, 2};
  const std::vector<TraceMessage> msgs = {
      ScaleRequest{3},
      UnscaleDone{3, 2, true, 0.1f},
      SetScale{3, INFINITY},
      IterationClosed{3, 2, true},
      GetParams{true},
      SetGrowthInterval{5},
      GetStateDict{},
      LoadStateDict{sd},
      TraceSubscribe{"trainer1"},
      UpdateScale{3, 2},
      UpdateWhenClosed{3},
      SetGrowthFactor{1.5},
      SetBackoffFactor{0.25},
      TraceUnsubscribe{"trainer2"},
      ScaleReply{3, 3.4028235e38f},
      ScaleParams{2, 0.3, 2, 0.5, 9, 4},
      sd,
      UpdateApplied{3, 1.5f, 1, true, true, false, false},
      TraceErrorReply{errc::bad_growth_factor, "quote \" and\nnewline"},
  };
  std::string text = to_json_line(h) + "\n";
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    TraceEvent e;
    e.seq = i;
    e.k = std::holds_alternative<TraceSubscribe>(msgs[i]) ||
                  std::holds_alternative<TraceUnsubscribe>(msgs[i]) ||
                  std::holds_alternative<GetParams>(msgs[i]) ||
                  std::holds_alternative<SetGrowthFactor>(msgs[i]) ||
                  std::holds_alternative<ScaleParams>(msgs[i]) ||
                  std::holds_alternative<StateDictMsg>(msgs[i]) ||
                  std::holds_alternative<TraceErrorReply>(msgs[i])
              ? 9
              : 3;
    e.from = is_keeper_input(msgs[i]) ? "trainer1" : trace_keeper;
    e.to = is_keeper_input(msgs[i]) ? trace_keeper : "trainer1";
    e.msg = msgs[i];
    text += to_json_line(e) + "\n";
  }
  std::istringstream in(text);
  const Trace t = parse_trace(in);
  CHECK(t.header.opts.init_scale() == 0.1);
  CHECK(t.header.opts.growth_interval() == 7);
  CHECK(t.header.policy == ScalePolicy::lagged);
  REQUIRE(t.events.size() == msgs.size());
  std::string again = to_json_line(t.header) + "\n";
  for (const auto& e : t.events)
    again += to_json_line(e) + "\n";
  CHECK(again == text);
  CHECK(std::get<UnscaleDone>(t.events[1].msg).scale_used == 0.1f);
  CHECK(std::isinf(std::get<SetScale>(t.events[2].msg).new_scale));
  CHECK(std::get<UpdateScale>(t.events[9].msg).unscales == 2);
  CHECK(std::get<SetGrowthInterval>(t.events[5].msg).value == 5);
  CHECK(std::get<TraceUnsubscribe>(t.events[13].msg).subscriber == "trainer2");
  CHECK(std::get<StateDictMsg>(t.events[16].msg).scale == 1e-300);
  CHECK(std::get<TraceErrorReply>(t.events[18].msg).what == "quote \" and\nnewline");
  CHECK(t.lines.back() == msgs.size() + 1);
}

TEST_CASE("numbers and texts read back bit for bit") {
  std::mt19937_64 rng(7);
  std::string text = to_json_line(TraceHeader{}) + "\n";
  std::vector<double> values;
  std::vector<std::string> texts;
  for (int i = 0; i < 2000; ++i) {
    double v;
    const std::uint64_t bits = rng();
    std::memcpy(&v, &bits, sizeof v);
    if (i % 2) v = double(float(std::ldexp(double(rng() % 100000), int(rng() % 80) - 40)));
    values.push_back(v);
    std::string t = "x";
    for (int j = 0; j < 6; ++j)
      t += char(rng() % 128);
    t += "\xc3\xa9";  // UTF-8 passes through
    texts.push_back(t);
    TraceEvent e;
    e.seq = std::uint64_t(2 * i);
    e.k = 1;
    e.from = "trainer1";
    e.to = trace_keeper;
    e.msg = SetScale{1, v};
    text += to_json_line(e) + "\n";
    e.seq += 1;
    e.from = trace_keeper;
    e.to = "trainer1";
    e.msg = TraceErrorReply{errc::bad_state_dict, t};
    text += to_json_line(e) + "\n";
  }
  std::istringstream in(text);
  const Trace t = parse_trace(in);
  REQUIRE(t.events.size() == 2 * values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double got = std::get<SetScale>(t.events[2 * i].msg).new_scale;
    if (std::isnan(values[i]))
      CHECK(std::isnan(got));
    else
      CHECK(got == values[i]);
    CHECK(std::get<TraceErrorReply>(t.events[2 * i + 1].msg).what == texts[i]);
  }
}

// An event as version v wrote it: no gradient size before 5 (version 5's UnscaleDone fields), no
// attribution and no collapse guard before 7.
std::string as_version(TraceEvent e, int v) {
  if (auto* d = std::get_if<UnscaleDone>(&e.msg)) {
    if (v < 5) d->grad_max = d->dtype_max = 0;
    if (v < 7) d->overflow.clear(), d->found_by.clear();
  }
  if (v < 7) {
    if (auto* r = std::get_if<ScaleReply>(&e.msg)) r->guard = {};
    if (auto* a = std::get_if<UpdateApplied>(&e.msg)) a->guard = {};
  }
  return to_json_line(e);
}

TEST_CASE("version 1 to 6 golden traces read as version 7 values and replay identically") {
  for (const auto& g : test::golden_traces()) {
    if (g.since > 6) continue;
    CAPTURE(g.file);
    const Trace now = read_trace(golden(g.file).string());
    CHECK(now.header.version == trace_schema_version);
    for (int v : {1, 2, 3, 4, 5, 6}) {
      if (v < g.since) continue;
      CAPTURE(v);
      const Trace old =
          read_trace((fs::path(AMPACTOR_TRACES_DIR) / ("v" + std::to_string(v)) / g.file).string());
      CHECK(old.header.version == v);
      // Versions 1 and 2 have no trailer and count as complete; version 3 on have one.
      CHECK(old.complete);
      CHECK(replay_trace(old).identical);
      // The same scenario, written by each version: the same events once read.
      REQUIRE(old.events.size() == now.events.size());
      for (std::size_t i = 0; i < old.events.size(); ++i)
        CHECK(to_json_line(old.events[i]) == as_version(now.events[i], v));
    }
  }
}

TEST_CASE(
    "version 4 and 5 deepspeed traces, recorded under DeepSpeed's old growth count, read and "
    "replay up to that count's first growth") {
  for (int v : {4, 5}) {
    CAPTURE(v);
    const Trace old = read_trace(
        (fs::path(AMPACTOR_TRACES_DIR) / ("v" + std::to_string(v)) / "deepspeed_rule_exact.jsonl")
            .string());
    CHECK(old.header.version == v);
    CHECK(old.header.opts.rule() == RuleKind::deepspeed);
    // The old count grew on the 2nd clean step after an overflow (window 2), DeepSpeed's own
    // grows on the 3rd: the replay diverges at that UpdateApplied, where the old one grew.
    const ReplayResult r = replay_trace(old);
    CHECK_FALSE(r.identical);
    CHECK(r.expected.find("\"type\":\"UpdateApplied\",\"msg\":{\"k\":3,") != std::string::npos);
    CHECK(r.expected.find("\"grew\":true") != std::string::npos);
    CHECK(r.got.find("\"grew\":false") != std::string::npos);
  }
}

TEST_CASE("the golden traces replay identically and cover overflows, optimizers and setters") {
  std::size_t backoffs = 0, errors = 0, deferred_getters = 0, loads = 0;
  std::set<std::string> optimizers;
  for (const auto& g : test::golden_traces()) {
    CAPTURE(g.file);
    const Trace t = read_trace(golden(g.file).string());
    const ReplayResult r = replay_trace(t);
    CHECK(r.identical);
    CHECK(r.matched == t.events.size());
    CHECK(t.events.size() > 30);
    for (const auto& a : all_of<UpdateApplied>(t))
      backoffs += a.backed_off;
    errors += all_of<TraceErrorReply>(t).size();
    loads += all_of<LoadStateDict>(t).size();
    for (const auto& gp : all_of<GetParams>(t))
      deferred_getters += gp.up_to_date;
    for (const auto& e : t.events)
      if (std::holds_alternative<UnscaleDone>(e.msg)) optimizers.insert(g.file + e.from);
  }
  CHECK(backoffs >= 3);
  CHECK(errors >= 1);
  CHECK(loads >= 1);
  CHECK(deferred_getters >= 4);
  CHECK(optimizers.count("two_optimizers_lagged.jsonloptimizer2") == 1);
}

TEST_CASE("regenerating the golden traces gives the committed files byte for byte") {
  for (const auto& g : test::golden_traces()) {
    CAPTURE(g.file);
    const fs::path out = scratch() / g.file;
    {
      auto f = std::make_shared<TraceFile>(out.string());
      g.make(f);
      REQUIRE(f->close());
    }
    CHECK(slurp(out) == slurp(golden(g.file)));
  }
}
