// The scale_keeper over random schedules, and the lagged policy against RoundPipe's rule.
#include "scale_keeper_fixture.h"

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
