// The scale_keeper under CAF's deterministic scheduler: every message is delivered when the test
// says so, so each ordering is exercised on purpose.
#include "doctest_torch.h"

#include <deque>
#include <optional>
#include <random>

#include "caf_fixture.h"
#include "scale_options.h"

using namespace ampactor;
using ampactor::test::Fixture;
using ampactor::test::opts;

TEST_CASE("exact: ScaleRequest{k} waits for update k-1, which waits for its UnscaleDone") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  auto r0 = f.take<ScaleReply>();
  REQUIRE(r0);
  CHECK(r0->scale == 128.0f);
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});
  CHECK(f.idle());  // deferred: update 0 still lacks its UnscaleDone
  f.send(UnscaleDone{0, 7, false, 128.0f});
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->k == 1);
  CHECK(r1->scale == 256.0f);
}

TEST_CASE("UnscaleDone before UpdateScale: the update applies when it arrives") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 7, true, 128.0f});
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->scale == 64.0f);
}

TEST_CASE("two optimizers reporting in either order: one update, after both") {
  for (bool inf_first : {true, false}) {
    CAPTURE(inf_first);
    Fixture f(opts(128, 2, 0.5, 1));
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    f.send(UpdateScale{0, 2});
    f.send(GetParams{true});
    f.send(UnscaleDone{0, inf_first ? 1u : 2u, inf_first, 128.0f});
    CHECK(f.idle());  // one report is not enough
    f.send(UnscaleDone{0, inf_first ? 2u : 1u, !inf_first, 128.0f});
    auto p = f.take<ScaleParams>();
    REQUIRE(p);
    CHECK(p->scale == 64.0);  // backed off once
    CHECK(p->applied_through == 0);
  }
}

TEST_CASE("a known count short of its reports: an abandoned IterationClosed releases the update") {
  for (bool close_first : {true, false}) {
    CAPTURE(close_first);
    Fixture f(opts(128, 2, 0.5, 1));
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    if (close_first) f.send(IterationClosed{0, 1, true});
    f.send(UpdateScale{0, 2});
    f.send(UnscaleDone{0, 1, true, 128.0f});
    f.send(ScaleRequest{1});
    if (!close_first) {
      CHECK(f.idle());  // one of two reports: waits
      f.send(IterationClosed{0, 1, true});
    }
    auto r = f.take<ScaleReply>();
    REQUIRE(r);
    CHECK(r->scale == 128.0f);  // abandoned: the inf found changes nothing
    // A closed iteration that is not abandoned releases nothing: the count still rules.
    f.send(UpdateScale{1, 1});
    f.send(IterationClosed{1, 1, false});
    f.send(GetParams{true});
    CHECK(f.idle());
    f.send(UnscaleDone{1, 1, false, 128.0f});
    auto p = f.take<ScaleParams>();
    REQUIRE(p);
    CHECK(p->applied_through == 1);
    CHECK(p->scale == 256.0);
  }
}

TEST_CASE("getters: up_to_date waits for earlier updates, otherwise answers at once") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(GetParams{false});
  auto now = f.take<ScaleParams>();
  REQUIRE(now);
  CHECK(now->scale == 128.0);  // predates the pending update
  CHECK(now->applied_through == -1);
  f.send(GetParams{true});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto fresh = f.take<ScaleParams>();
  REQUIRE(fresh);
  CHECK(fresh->scale == 256.0);
  CHECK(fresh->applied_through == 0);
}

TEST_CASE("setters apply in mailbox order: after the updates sent before them") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(SetGrowthFactor{4.0});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 256.0);  // update 0 grew with the old factor 2
  CHECK(p->growth_factor == 4.0);
  f.send(UnscaleDone{1, 1, false, 256.0f});
  f.send(UpdateScale{1, 1});
  f.send(GetParams{true});
  auto q = f.take<ScaleParams>();
  REQUIRE(q);
  CHECK(q->scale == 1024.0);  // update 1 used the new factor
}

TEST_CASE("a refused setter or load changes nothing and answers with an error") {
  Fixture f(opts(128, 2, 0.5, 3));
  f.send(SetGrowthFactor{0.5});
  CHECK_FALSE(f.take<ScaleParams>());
  REQUIRE(f.last_error);
  CHECK(to_exception(f.last_error).code() == errc::bad_growth_factor);
  f.last_error = caf::error{};
  f.send(LoadStateDict{StateDictMsg{}});
  CHECK_FALSE(f.take<ScaleParams>());
  REQUIRE(f.last_error);
  CHECK(std::string(to_exception(f.last_error).what()) ==
        "The source state dict is empty, possibly because it was saved from a disabled instance "
        "of GradScaler.");
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->growth_factor == 2.0);
  CHECK(p->growth_interval == 3);
}

TEST_CASE("state_dict is a consistent snapshot: pending updates are applied first") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(GetStateDict{});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto sd = f.take<StateDictMsg>();
  REQUIRE(sd);
  CHECK_FALSE(sd->empty);
  CHECK(sd->scale == 256.0);
  // and it loads into a fresh keeper
  Fixture g;
  g.send(LoadStateDict{*sd});
  auto p = g.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 256.0);
}

TEST_CASE("UpdateScale with a new scale sets it and keeps the tracker, never applied twice") {
  Fixture f(opts(128, 2, 0.5, 10));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 1, false, 128.0f});
  f.send(UpdateScale{0, 1});
  f.send(SetScale{1, 5.0});
  f.send(SetScale{1, 9.0});                 // a duplicate of iteration 1 is dropped
  f.send(UnscaleDone{0, 1, true, 128.0f});  // a late report for an applied update too
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 5.0);
  CHECK(p->growth_tracker == 1);
  f.send(UnscaleDone{2, 1, false, 5.0f});
  f.send(UpdateScale{2, 1});
  f.send(GetParams{true});
  auto q = f.take<ScaleParams>();
  REQUIRE(q);
  CHECK(q->growth_tracker == 2);  // the late inf report did not reset it
}

TEST_CASE("subscribers receive UpdateApplied") {
  Fixture f(opts(8, 2, 0.5, 1));
  f.send(subscribe_atom::value, caf::actor_cast<trainer_actor>(f.self));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 1, true, 8.0f});
  f.send(UpdateScale{0, 1});
  auto a = f.take<UpdateApplied>();
  REQUIRE(a);
  CHECK(a->k == 0);
  CHECK(a->found_inf);
  CHECK(a->backed_off);
  CHECK(a->scale == 4.0f);
}

TEST_CASE("lagged: answered at once, one overflow event gives one backoff") {
  Fixture f(opts(1024, 2, 0.5, 100), ScalePolicy::lagged);
  f.send(ScaleRequest{0});
  CHECK(f.take<ScaleReply>()->scale == 1024.0f);
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});  // answered before update 0 is applied: one iteration late
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->scale == 1024.0f);
  // Iteration 0 overflowed at 1024; iteration 1's grads, made with the same 1024, overflow too.
  f.send(UnscaleDone{0, 1, true, 1024.0f});
  f.send(UpdateScale{1, 1});
  f.send(UnscaleDone{1, 1, true, 1024.0f});
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 512.0);  // RoundPipe would be at 256
  CHECK(p->growth_tracker == 0);
}

// The exact policy over many random found_inf schedules and message orders equals the
// thread-free rule applied in iteration order.
TEST_CASE("exact: random schedules and orders give the thread-free trajectory") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 2000; ++trial) {
    const int optimizers = 1 + int(rng() % 3);
    GradScalerOptions o = opts(double(1 << (rng() % 16)), 2.0, 0.5, 1 + rng() % 4);
    Fixture f(o);
    ScaleState ref(o);
    ref.lazy_init();
    for (iteration_t k = 0; k < 25; ++k) {
      f.send(ScaleRequest{k});
      auto r = f.take<ScaleReply>();
      REQUIRE(r);
      REQUIRE(r->scale == ref.scale());
      bool any = false;
      std::vector<UnscaleDone> reports;
      for (int i = 0; i < optimizers; ++i) {
        const bool inf = rng() % 5 == 0;
        any |= inf;
        reports.push_back({k, optimizer_id(i), inf, r->scale});
      }
      std::shuffle(reports.begin(), reports.end(), rng);
      const std::size_t before = rng() % (reports.size() + 1);  // how many arrive before the update
      for (std::size_t i = 0; i < before; ++i)
        f.send(reports[i]);
      f.send(UpdateScale{k, optimizers});
      for (std::size_t i = before; i < reports.size(); ++i)
        f.send(reports[i]);
      ref.update(any);
    }
    f.send(GetParams{true});
    auto p = f.take<ScaleParams>();
    REQUIRE(p);
    CHECK(p->scale == double(ref.scale()));
    CHECK(p->growth_tracker == ref.growth_tracker());
  }
}

namespace {

/// Counts of one run.
struct Counts {
  int skips = 0;
  int backoffs = 0;
  std::vector<float> scales;  // the scale each iteration was made with
  float final_scale = 0;
};

/// Overflow as fp16 gradients would have it: the largest gradient times the scale above 65504.
bool overflows(float scale, float gmax) {
  return double(scale) * double(gmax) > 65504.0;
}

/// RoundPipe's scaler, thread-free, from its description: iteration k scales and unscales with
/// A = N as it was after update k-2 (update() sets A <- N before queuing update k-1's job).
/// Every overflow backs off.
Counts roundpipe(const GradScalerOptions& o, const std::vector<float>& gmax) {
  ScaleState n(o);
  n.lazy_init();
  std::vector<float> after;  // N after each update
  Counts c;
  for (std::size_t k = 0; k < gmax.size(); ++k) {
    const float a = k < 2 ? float(o.init_scale()) : after[k - 2];
    c.scales.push_back(a);
    const bool inf = overflows(a, gmax[k]);
    c.skips += inf;
    c.backoffs += n.update(inf).backed_off;
    after.push_back(n.scale());
  }
  c.final_scale = n.scale();
  return c;
}

/// The keeper driven with the same one-iteration lag: ScaleRequest{k} is answered while update
/// k-1 still waits for its UnscaleDone.
Counts keeper_run(const GradScalerOptions& o, ScalePolicy policy, const std::vector<float>& gmax) {
  Fixture f(o, policy);
  f.send(subscribe_atom::value, caf::actor_cast<trainer_actor>(f.self));
  Counts c;
  std::deque<ScaleReply> replies;
  std::deque<ScaleParams> params;
  auto pump = [&] {  // everything the keeper said, sorted by kind
    while (!f.idle())
      f.self->receive([&](const ScaleReply& r) { replies.push_back(r); },
                      [&](const UpdateApplied& a) { c.backoffs += a.backed_off; },
                      [&](const ScaleParams& p) { params.push_back(p); });
  };
  std::optional<UnscaleDone> withheld;
  for (iteration_t k = 0; k < iteration_t(gmax.size()); ++k) {
    f.send(ScaleRequest{k});
    pump();
    if (policy == ScalePolicy::exact && withheld) {
      CHECK(replies.empty());  // exact: the reply waits for update k-1
    } else {
      REQUIRE(replies.size() == 1);  // lagged: answered while update k-1 still waits
    }
    if (withheld) f.send(*withheld);
    pump();
    REQUIRE(replies.size() == 1);
    const ScaleReply r = replies.front();
    replies.pop_front();
    CHECK(r.k == k);
    c.scales.push_back(r.scale);
    const bool inf = overflows(r.scale, gmax[std::size_t(k)]);
    c.skips += inf;
    f.send(UpdateScale{k, 1});
    withheld = UnscaleDone{k, 1, inf, r.scale};
  }
  f.send(*withheld);
  f.send(GetParams{true});
  pump();
  REQUIRE(params.size() == 1);
  c.final_scale = float(params.front().scale);
  return c;
}

}  // namespace

// Gradients whose largest magnitude jumps at one iteration and stays there (as after a
// learning-rate change): one overflow event, answered by one backoff (65536 -> 32768 suffices).
// RoundPipe reacts one iteration late and backs off twice; lagged skips the same two steps but
// backs off once; exact skips one step and backs off once.
TEST_CASE("lagged vs RoundPipe vs exact: skips and backoffs per overflow event") {
  const GradScalerOptions o = opts(65536, 2, 0.5, 1000000);  // no growth: counts stay clean
  for (int at : {1, 5, 17, 30}) {
    CAPTURE(at);
    std::vector<float> gmax(40, 0.25f);
    std::fill(gmax.begin() + at, gmax.end(), 1.5f);  // overflows at 65536, not at 32768
    const Counts rp = roundpipe(o, gmax);
    const Counts lagged = keeper_run(o, ScalePolicy::lagged, gmax);
    const Counts exact = keeper_run(o, ScalePolicy::exact, gmax);
    CHECK(rp.skips == 2);
    CHECK(rp.backoffs == 2);
    CHECK(lagged.skips == 2);
    CHECK(lagged.backoffs == 1);
    CHECK(exact.skips == 1);
    CHECK(exact.backoffs == 1);
    CHECK(rp.final_scale == 16384.0f);  // s/4 for one event
    CHECK(lagged.final_scale == 32768.0f);
    CHECK(exact.final_scale == 32768.0f);
    // Before the event all three agree; lagged and RoundPipe until the double backoff lands.
    for (int k = 0; k <= at; ++k) {
      CHECK(lagged.scales[k] == rp.scales[k]);
      CHECK(exact.scales[k] == rp.scales[k]);
    }
    CHECK(lagged.scales[at + 1] == rp.scales[at + 1]);  // both still at 65536: the second skip
    CHECK(exact.scales[at + 1] == 32768.0f);            // exact reacted at once
    CHECK(rp.scales[at + 3] == lagged.scales[at + 3] / 2);
  }
}

// Random regimes, growth on: lagged equals RoundPipe except for the double backoffs it avoids.
// Whenever RoundPipe backs off twice in a row for one event, lagged backs off once; so lagged
// never backs off more often than RoundPipe and never skips fewer steps per event.
TEST_CASE("lagged vs RoundPipe over random schedules: identical until the first double backoff") {
  std::mt19937 rng(777);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const GradScalerOptions o = opts(double(1 << (10 + rng() % 8)), 2, 0.5, 2 + rng() % 6);
    std::vector<float> gmax(40);
    float level = 0.05f;
    for (float& g : gmax) {
      if (rng() % 8 == 0) level = 0.05f * float(1 << (rng() % 10));
      g = level;
    }
    const Counts rp = roundpipe(o, gmax);
    const Counts lagged = keeper_run(o, ScalePolicy::lagged, gmax);
    // The first overflow that follows an overflow: its grads were made before the backoff that
    // answered the previous one, so RoundPipe backs off again and lagged does not. Until the
    // scale that update decides (used two iterations later), the two must agree exactly.
    std::size_t first_double = gmax.size();
    for (std::size_t k = 1; k < gmax.size(); ++k)
      if (overflows(rp.scales[k], gmax[k]) && overflows(rp.scales[k - 1], gmax[k - 1])) {
        first_double = k;
        break;
      }
    const std::size_t agree = std::min(gmax.size(), first_double + 2);
    for (std::size_t k = 0; k < agree; ++k)
      REQUIRE(lagged.scales[k] == rp.scales[k]);
    if (first_double == gmax.size()) {
      CHECK(lagged.skips == rp.skips);
      CHECK(lagged.backoffs == rp.backoffs);
      CHECK(lagged.final_scale == rp.final_scale);
    } else {
      ++compared;
      if (first_double + 2 < gmax.size())
        CHECK(rp.scales[first_double + 2] < lagged.scales[first_double + 2]);
    }
  }
  CHECK(compared > 50);  // the schedules do produce double backoffs
}
