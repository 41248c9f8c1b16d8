// The peers' state_dict layouts both ways: a run started in a peer continues in ampactor with
// the same scales bit for bit (its dict converted and loaded mid-run), and an ampactor run
// continues in the peer (peer_reference.h) the same way; wrong dicts are refused by key.
#include <doctest/doctest.h>

#include <ampactor/core/peer_state_dict.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/state_dict.h>

#include <functional>
#include <random>
#include <stdexcept>

#include "deepspeed_fixtures.h"
#include "peer_reference.h"
#include "refusal.h"

using namespace ampactor;
using ampactor::test::refusal_of;
namespace peer = ampactor::test::peer;

namespace {

/// A peer's scaler behind plain functions: update, its scale, its dict, and one built from a dict.
template <class P>
struct PeerOps {
  std::function<void(P&, bool)> update;
  std::function<double(const P&)> scale;
  std::function<StateDict(const P&)> save;
  std::function<P(const StateDict&)> load;
};

/// Both directions: the peer runs `n` random updates, its dict goes into a fresh ampactor scaler
/// and both go on for `n` more, equal after each; then the same with ampactor first.
/// `restarts`: the peer's dict lacks some state (Colossal-AI's counters), so each side is
/// compared with the other resumed from the dict, as the peer itself resumes.
template <class P>
void both_ways(RuleKind layout, const GradScalerOptions& opts, P start, const PeerOps<P>& ops,
               unsigned seed, bool restarts = false) {
  const int n = 300;
  for (double p : {0.1, 0.4}) {  // growth stays within float's range
    CAPTURE(p);
    std::mt19937 rng(seed);
    std::bernoulli_distribution overflow(p);
    // peer -> ampactor
    P ref = start;
    for (int i = 0; i < n; ++i)
      ops.update(ref, overflow(rng));
    ScaleState ours(opts);
    load_state_dict(ours, from_peer_state_dict(ops.save(ref), opts, layout));
    if (restarts) ref = ops.load(ops.save(ref));
    ours.lazy_init();
    // Where the peer's scale falls below the smallest a checkpoint can hold, ampactor stops the
    // run (the collapse guard: scale_collapsed, nothing changed) and the comparison ends.
    auto collapsed = [](ScaleState& s, bool inf, double peer) {
      if (float(peer) >= ampactor::smallest_scale()) return false;
      CHECK(refusal_of([&] { s.update(inf); }).code == errc::scale_collapsed);
      return true;
    };
    for (int i = 0; i < n; ++i) {
      const bool inf = overflow(rng);
      ops.update(ref, inf);
      if (collapsed(ours, inf, ops.scale(ref))) break;
      ours.update(inf);
      REQUIRE(double(ours.scale()) == ops.scale(ref));
    }
    // ampactor -> peer
    ScaleState mine(opts);
    mine.lazy_init();
    bool gone = false;
    for (int i = 0; i < n && !gone; ++i)
      try {
        mine.update(overflow(rng));
      } catch (const ScalerError& e) {
        CHECK(e.code() == errc::scale_collapsed);
        gone = true;
      }
    if (gone) continue;
    const StateDict exported = to_peer_state_dict(make_state_dict(mine), opts, layout);
    P theirs = ops.load(exported);
    // and back: the dict of the peer's view converts to the same state
    ScaleState again(opts);
    load_state_dict(again, from_peer_state_dict(exported, opts, layout));
    again.lazy_init();
    for (int i = 0; i < n; ++i) {
      const bool inf = overflow(rng);
      ops.update(theirs, inf);
      if (collapsed(again, inf, ops.scale(theirs))) break;
      mine.update(inf);
      again.update(inf);
      REQUIRE(double(again.scale()) == ops.scale(theirs));
      if (!restarts) REQUIRE(again.scale() == mine.scale());
    }
  }
}

}  // namespace

TEST_CASE("deepspeed's layout both ways continues the trajectory bit for bit") {
  const auto opts = GradScalerOptions::deepspeed()
                        .init_scale(64)
                        .growth_interval(10)
                        .hysteresis(3)
                        .raise_at_min_scale(false);
  peer::DeepSpeed start{};
  start.cur_scale = 64, start.scale_window = 10, start.delayed_shift = 3, start.cur_hysteresis = 3;
  start.raise_error_at_min_scale = false;
  PeerOps<peer::DeepSpeed> ops;
  ops.update = [](peer::DeepSpeed& d, bool o) { d.update_scale(o); };
  ops.scale = [](const peer::DeepSpeed& d) { return d.cur_scale; };
  ops.save = [](const peer::DeepSpeed& d) {
    StateDict sd;
    sd.set("cur_scale", d.cur_scale);
    sd.set("cur_iter", d.cur_iter);
    sd.set("last_overflow_iter", d.last_overflow_iter);
    sd.set("scale_factor", d.scale_factor);
    sd.set("scale_window", d.scale_window);
    sd.set("min_scale", d.min_scale);
    sd.set("delayed_shift", d.delayed_shift);
    sd.set("cur_hysteresis", d.cur_hysteresis);
    return sd;
  };
  ops.load = [start](const StateDict& sd) {
    peer::DeepSpeed d = start;
    d.cur_scale = sd.get_double("cur_scale"), d.cur_iter = sd.get_int("cur_iter");
    d.last_overflow_iter = sd.get_int("last_overflow_iter");
    d.cur_hysteresis = sd.get_int("cur_hysteresis");
    return d;
  };
  both_ways(RuleKind::deepspeed, opts, start, ops, 1);
}

namespace {

/// DeepSpeed's attributes as peer_state_dict writes them, in peer_reference.h's DynamicLossScaler.
peer::DeepSpeed deepspeed_from(const StateDict& sd, const test::DsCase& c) {
  peer::DeepSpeed d{};
  d.cur_scale = sd.get_double("cur_scale"), d.scale_factor = sd.get_double("scale_factor");
  d.cur_iter = sd.get_int("cur_iter"), d.last_overflow_iter = sd.get_int("last_overflow_iter");
  d.scale_window = sd.get_int("scale_window"), d.min_scale = sd.get_double("min_scale");
  d.delayed_shift = sd.get_int("delayed_shift"), d.cur_hysteresis = sd.get_int("cur_hysteresis");
  d.consecutive_hysteresis = c.consecutive_hysteresis;
  d.raise_error_at_min_scale = c.raise_error_at_min_scale;
  return d;
}

test::DsStep step_of(ScaleState& s, bool inf) {
  test::DsStep got;
  got.raised = refusal_of([&] { s.update(inf); }).code == errc::scale_at_minimum;
  got.scale = s.scale(), got.hysteresis = s.hysteresis_tracker();
  return got;
}

}  // namespace

TEST_CASE(
    "deepspeed's layout: the real DynamicLossScaler's state mid-run, converted in and back out, "
    "continues as DeepSpeed did") {
  for (const test::DsCase& c : test::deepspeed_fixtures().cases) {
    CAPTURE(c.name);
    const GradScalerOptions opts = c.options();
    const std::size_t next = c.resume_at + 1;
    ScaleState in(opts);
    load_state_dict(in, from_peer_state_dict(c.resumed, opts, RuleKind::deepspeed));
    in.lazy_init();
    const StateDict out = to_peer_state_dict(make_state_dict(in), opts, RuleKind::deepspeed);
    CHECK(test::first_divergence(c, next, c.all_floats(),
                                 [&](bool inf) { return step_of(in, inf); }) == -1);
    // Back out: ampactor's dict holds its float scale, which DeepSpeed's raise test compares with
    // its double min_scale; the same only where every scale is a float.
    if (!c.all_floats()) continue;
    peer::DeepSpeed resumed = deepspeed_from(out, c);
    CHECK(test::first_divergence(c, next, true, [&](bool inf) {
            test::DsStep got;
            try {
              resumed.update_scale(inf);
            } catch (const std::runtime_error&) {
              got.raised = true;
            }
            got.scale = resumed.cur_scale, got.hysteresis = resumed.cur_hysteresis;
            return got;
          }) == -1);
  }
}

TEST_CASE(
    "deepspeed's layout: a scale at a min_scale that is no float goes out as DeepSpeed's "
    "min_scale, so DeepSpeed raises at the next overflow as ampactor would") {
  for (double min_scale : {0.3, 0.1, 1e-3}) {
    CAPTURE(min_scale);
    const auto opts = GradScalerOptions::deepspeed()
                          .init_scale(1)
                          .hysteresis(1)
                          .min_scale(min_scale)
                          .raise_at_min_scale(true);
    ScaleState s(opts);
    s.lazy_init();
    for (int i = 0; i < 64 && s.scale() != float(min_scale); ++i)
      s.update(true);
    REQUIRE(s.scale() == float(min_scale));
    CHECK(refusal_of([&] { s.update(true); }).code == errc::scale_at_minimum);  // ampactor raises
    const StateDict out = to_peer_state_dict(make_state_dict(s), opts, RuleKind::deepspeed);
    CHECK(out.get_double("cur_scale") == min_scale);
    peer::DeepSpeed d{};
    d.cur_scale = out.get_double("cur_scale"), d.min_scale = out.get_double("min_scale");
    d.scale_factor = out.get_double("scale_factor"), d.cur_iter = out.get_int("cur_iter");
    d.delayed_shift = out.get_int("delayed_shift"),
    d.cur_hysteresis = out.get_int("cur_hysteresis");
    CHECK_THROWS_AS(d.update_scale(true), std::runtime_error);  // and so does DeepSpeed
    // And back in: the same floor.
    ScaleState back(opts);
    load_state_dict(back, from_peer_state_dict(out, opts, RuleKind::deepspeed));
    back.lazy_init();
    CHECK(back.scale() == float(min_scale));
  }
}

TEST_CASE("megatron's and apex's layouts both ways continue the trajectory bit for bit") {
  const auto mopts =
      GradScalerOptions::megatron().init_scale(256).growth_interval(10).hysteresis(3);
  peer::Megatron m{};
  m.scale = 256, m.growth_interval = 10, m.hysteresis = 3, m.hysteresis_tracker = 3;
  PeerOps<peer::Megatron> mops;
  mops.update = [](peer::Megatron& x, bool o) { x.update(o); };
  mops.scale = [](const peer::Megatron& x) { return double(x.scale); };
  mops.save = [](const peer::Megatron& x) {
    StateDict sd;
    sd.set("scale", double(x.scale));
    sd.set("growth_tracker", x.growth_tracker);
    sd.set("hysteresis_tracker", x.hysteresis_tracker);
    return sd;
  };
  mops.load = [m](const StateDict& sd) {
    peer::Megatron x = m;
    x.scale = float(sd.get_double("scale")), x.growth_tracker = sd.get_int("growth_tracker");
    x.hysteresis_tracker = sd.get_int("hysteresis_tracker");
    return x;
  };
  both_ways(RuleKind::megatron, mopts, m, mops, 2);

  const auto aopts = GradScalerOptions::apex().init_scale(512).growth_interval(10).min_scale(1);
  peer::Apex a{};
  a.loss_scale = 512, a.scale_seq_len = 10, a.min_loss_scale = 1;
  PeerOps<peer::Apex> aops;
  aops.update = [](peer::Apex& x, bool o) { x.update_scale(o); };
  aops.scale = [](const peer::Apex& x) { return x.loss_scale; };
  aops.save = [](const peer::Apex& x) {
    StateDict sd;
    sd.set("loss_scale", x.loss_scale);
    sd.set("unskipped", x.unskipped);
    return sd;
  };
  aops.load = [a](const StateDict& sd) {
    peer::Apex x = a;
    x.loss_scale = sd.get_double("loss_scale"), x.unskipped = sd.get_int("unskipped");
    return x;
  };
  both_ways(RuleKind::apex, aopts, a, aops, 3);
}

TEST_CASE("keras's, tf's and jmp's layouts both ways continue the trajectory bit for bit") {
  peer::Keras k{};
  k.dynamic_growth_steps = 10;
  PeerOps<peer::Keras> kops;
  kops.update = [](peer::Keras& x, bool o) { x.apply(!o); };
  kops.scale = [](const peer::Keras& x) { return double(x.dynamic_scale); };
  kops.save = [](const peer::Keras& x) {
    StateDict sd;
    sd.set("dynamic_scale", double(x.dynamic_scale));
    sd.set("step_counter", x.step_counter);
    return sd;
  };
  kops.load = [k](const StateDict& sd) {
    peer::Keras x = k;
    x.dynamic_scale = float(sd.get_double("dynamic_scale"));
    x.step_counter = sd.get_int("step_counter");
    return x;
  };
  both_ways(RuleKind::keras, GradScalerOptions::keras().growth_interval(10), k, kops, 4);

  peer::TF t{};
  t.increment_period = 10;
  PeerOps<peer::TF> tops;
  tops.update = [](peer::TF& x, bool o) { x.update(!o); };
  tops.scale = [](const peer::TF& x) { return double(x.current_loss_scale); };
  tops.save = [](const peer::TF& x) {
    StateDict sd;
    sd.set("current_loss_scale", double(x.current_loss_scale));
    sd.set("good_steps", x.num_good_steps);
    return sd;
  };
  tops.load = [t](const StateDict& sd) {
    peer::TF x = t;
    x.current_loss_scale = float(sd.get_double("current_loss_scale"));
    x.num_good_steps = sd.get_int("good_steps");
    return x;
  };
  both_ways(RuleKind::tf, GradScalerOptions::tf().growth_interval(10), t, tops, 5);

  peer::Jmp j{};
  j.period = 10;
  PeerOps<peer::Jmp> jops;
  jops.update = [](peer::Jmp& x, bool o) { x.adjust(!o); };
  jops.scale = [](const peer::Jmp& x) { return double(x.loss_scale); };
  jops.save = [](const peer::Jmp& x) {
    StateDict sd;
    sd.set("loss_scale", double(x.loss_scale));
    sd.set("counter", std::int64_t(x.counter));
    return sd;
  };
  jops.load = [j](const StateDict& sd) {
    peer::Jmp x = j;
    x.loss_scale = float(sd.get_double("loss_scale"));
    x.counter = std::int32_t(sd.get_int("counter"));
    return x;
  };
  both_ways(RuleKind::jmp, GradScalerOptions::jmp().growth_interval(10), j, jops, 6);
}

TEST_CASE("colossalai's layout: its step counters restart on a resume, as in Colossal-AI") {
  const auto opts = GradScalerOptions::colossalai().growth_interval(10);
  peer::ColossalAI c{};
  c.growth_interval = 10, c.min_scale = 1, c.max_scale = 4294967296.0f;
  PeerOps<peer::ColossalAI> ops;
  ops.update = [](peer::ColossalAI& x, bool o) { x.update(o); };
  ops.scale = [](const peer::ColossalAI& x) { return double(x.scale); };
  // Colossal-AI's own resume: a fresh scaler given scale and factors, counters at 0.
  ops.save = [](const peer::ColossalAI& x) {
    StateDict sd;
    sd.set("scale", double(x.scale));
    sd.set("growth_factor", x.growth_factor);
    sd.set("backoff_factor", x.backoff_factor);
    sd.set("hysteresis", x.hysteresis);
    return sd;
  };
  ops.load = [c](const StateDict& sd) {
    peer::ColossalAI x = c;
    x.scale = float(sd.get_double("scale"));
    return x;
  };
  both_ways(RuleKind::colossalai, opts, c, ops, 7, /*restarts=*/true);
}

TEST_CASE("a peer's dict that does not fit is refused by key, and nothing is loaded") {
  const auto ds = GradScalerOptions::deepspeed();
  StateDict sd;
  sd.set("cur_scale", 1024.0);
  sd.set("cur_iter", std::int64_t(10));
  sd.set("last_overflow_iter", std::int64_t(4));
  sd.set("scale_factor", 2.0);
  sd.set("scale_window", std::int64_t(1000));
  sd.set("min_scale", 1.0);
  sd.set("delayed_shift", std::int64_t(2));
  sd.set("cur_hysteresis", std::int64_t(1));
  const StateDict ours = from_peer_state_dict(sd, ds, RuleKind::deepspeed);
  CHECK(ours.get_int("_growth_tracker") == 5);  // stable_interval 10 - 4 - 1, below the window
  CHECK(ours.get_int("_hysteresis_tracker") == 1);
  auto refused = [&](StateDict d, const GradScalerOptions& o) {
    return refusal_of([&] { from_peer_state_dict(d, o, RuleKind::deepspeed); });
  };
  StateDict missing = sd;
  missing.erase("cur_iter");
  CHECK(refused(missing, ds).what == "deepspeed state_dict: missing the key 'cur_iter'");
  StateDict typed = sd;
  typed.set("cur_iter", 10.0);
  CHECK(refused(typed, ds).what ==
        "deepspeed state_dict: ['cur_iter'] must be an int, got a float");
  CHECK(refused(sd, GradScalerOptions::deepspeed().min_scale(0.5)).what ==
        "deepspeed state_dict: ['min_scale'] is 1, the scaler's is 0.5: build the scaler with the "
        "peer's setting");
  CHECK(refused(sd, GradScalerOptions()).what ==
        "deepspeed state_dict: needs a scaler with the deepspeed rule "
        "(GradScalerOptions::deepspeed()), this one has the torch rule");
  StateDict order = sd;
  order.set("last_overflow_iter", std::int64_t(10));
  CHECK(refused(order, ds).code == errc::bad_state_dict);
  StateDict before_start = sd;
  before_start.set("last_overflow_iter", std::int64_t(-2));
  CHECK(refused(before_start, ds).what ==
        "deepspeed state_dict: ['last_overflow_iter'] must be >= -1, got -2");
  // A converted dict with a value load_state_dict refuses: the scaler stays as it was.
  StateDict m;
  m.set("scale", 8.0);
  m.set("growth_tracker", std::int64_t(-1));
  m.set("hysteresis_tracker", std::int64_t(2));
  ScaleState s(GradScalerOptions::megatron());
  const ScaleState before = s;
  CHECK(refusal_of([&] {
          load_state_dict(
              s, from_peer_state_dict(m, GradScalerOptions::megatron(), RuleKind::megatron));
        }).code == errc::bad_state_dict);
  CHECK(s == before);
}
