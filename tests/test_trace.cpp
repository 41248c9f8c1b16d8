// Keeper traces: what the keeper records and in which order, the JSON Lines form, validation of
// bad traces, exact replay of the golden traces, what-if replay, ampactor-replay's exit codes, and
// a trace recorded by the GradScaler facade with real threads.
#include "doctest_torch.h"

#include <ampactor/grad_scaler.h>
#include <ampactor/scaler/scale_state.h>
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <ATen/ops/ones.h>

#include <ftw.h>
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
#include "workload.h"

using namespace ampactor;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream o;
  o << in.rdbuf();
  return o.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines)
    s += l + "\n";
  return s;
}

/// A scratch directory of this process, removed at exit. Not by std::filesystem::remove_all:
/// a PyTorch wheel's libtorch.so exports a copy of it that jumps to null (seen with torch 2.11),
/// and the dynamic linker binds the test's call to that copy.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("ampactor-trace-test-" + std::to_string(getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    nftw(
        dir.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
};
const fs::path& scratch() {
  static Scratch s;
  return s.dir;
}

fs::path golden(const char* name) {
  return fs::path(AMPACTOR_TRACES_DIR) / name;
}

/// The message of the TraceError reading `text` throws.
TraceError read_error(const std::string& text) {
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

int run_replay(const std::string& args, const fs::path& out) {
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

TEST_CASE("version 1 golden traces read as version 2 values and replay identically") {
  for (const auto& g : test::golden_traces()) {
    CAPTURE(g.file);
    const Trace v1 = read_trace((fs::path(AMPACTOR_TRACES_DIR) / "v1" / g.file).string());
    const Trace v2 = read_trace(golden(g.file).string());
    CHECK(v1.header.version == 1);
    CHECK(v2.header.version == 2);
    CHECK(replay_trace(v1).identical);
    // The same scenario, written by each version: the same events once read.
    REQUIRE(v1.events.size() == v2.events.size());
    for (std::size_t i = 0; i < v1.events.size(); ++i)
      CHECK(to_json_line(v1.events[i]) == to_json_line(v2.events[i]));
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
    const TraceError e = read_error(with(0, "\"version\":2", "\"version\":3"));
    CHECK(e.line() == 1);
    CHECK(std::string(e.what()).find("unsupported trace schema version 3") != std::string::npos);
  }
  SUBCASE("a version 2 message in a version 1 trace") {
    const TraceError e = read_error(with(0, "\"version\":2", "\"version\":1"));
    CHECK(e.line() > 1);
    CHECK(std::string(e.what()).find("UpdateScale") != std::string::npos);
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
  std::int64_t backoffs = 0;
  for (const auto& row : w.rows) {
    CAPTURE(row.k);
    CHECK(row.whatif_scale == ref.scale());
    backoffs += ref.update(row.found_inf).backed_off;
  }
  CHECK(w.whatif.backoffs == backoffs);
  CHECK(w.whatif.final_scale == double(ref.scale()));
  CHECK(w.whatif.growths > w.recorded.growths);
  CHECK(w.whatif.skips == w.recorded.skips);  // the same found_inf sequence
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
  CHECK(w.whatif.skips == w.recorded.skips);
  CHECK(w.whatif.backoffs <= w.recorded.backoffs);
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
    GradScaler scaler(o, ScalePolicy::exact, recorder);
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
    GradScaler scaler(o, ScalePolicy::exact, record_trace(path.string()));
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
