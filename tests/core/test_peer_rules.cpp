// The peers' update rules (rules.h) against line-by-line transcriptions of their Python
// (peer_reference.h) on random found_inf schedules: the scale equal bit for bit after every
// update, with the peer's defaults and with bounds, hysteresis and intervals that make every
// branch run. The one designed departure, a growth past float's range, is checked as such.
#include <doctest/doctest.h>

#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>

#include "peer_reference.h"
#include "refusal.h"

using ampactor::errc;
using ampactor::GradScalerOptions;
using ampactor::ScaleState;
using ampactor::test::refusal_of;
namespace peer = ampactor::test::peer;

namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

/// One peer's step and its scale as a double (the peer's own value, unrounded).
struct Peer {
  std::function<void(bool)> update;
  std::function<double()> scale;
};

/// Drives `options`' rule and `ref` through `steps` random updates (overflow with probability
/// p) and requires the same scale after each. A scale the peer takes out of float's range is the
/// designed departure (ampactor refuses such a growth, and rounds such a backoff to the float it
/// is), and the comparison ends there.
void compare(const GradScalerOptions& options, Peer ref, double p, int steps, unsigned seed) {
  REQUIRE_NOTHROW(options.validate());
  ScaleState state(options);
  state.lazy_init();
  std::mt19937 rng(seed);
  std::bernoulli_distribution overflow(p);
  REQUIRE(double(state.scale()) == ref.scale());
  for (int i = 0; i < steps; ++i) {
    const bool inf = overflow(rng);
    CAPTURE(i);
    CAPTURE(inf);
    bool peer_raised = false;
    try {
      ref.update(inf);
    } catch (const std::runtime_error&) {
      peer_raised = true;
    }
    if (peer_raised) {  // deepspeed at its minimum: the same error, and nothing changed
      const float before = state.scale();
      CHECK(refusal_of([&] { state.update(inf); }).code == errc::scale_at_minimum);
      REQUIRE(state.scale() == before);
      continue;
    }
    const double want = ref.scale();
    if (float(want) < ampactor::smallest_scale()) {
      // Below the smallest scale a checkpoint can hold, ampactor stops the run (the collapse
      // guard), changing nothing, and the comparison ends.
      const float before = state.scale();
      CHECK(refusal_of([&] { state.update(inf); }).code == errc::scale_collapsed);
      CHECK(state.scale() == before);
      return;
    }
    if (!(std::fabs(want) <= kFloatMax)) {
      const ampactor::UpdateOutcome out = state.update(inf);
      CHECK(out.growth_refused);
      return;
    }
    state.update(inf);
    if (double(float(want)) != want) {
      // A Python-double peer (apex without a floor) below float's smallest value: ampactor holds
      // the float it rounds to, and the comparison ends.
      CHECK(state.scale() == float(want));
      return;
    }
    REQUIRE(double(state.scale()) == want);
  }
}

const double kProbabilities[] = {0.02, 0.3, 0.7};

}  // namespace

TEST_CASE("deepspeed: equal to DynamicLossScaler bit for bit") {
  unsigned seed = 1;
  for (std::int64_t shift : {1, 2, 3})
    for (bool consecutive : {false, true})
      for (double min_scale : {1.0, 0.25})
        for (bool raise : {true, false})
          for (std::int64_t window : {1, 2, 5})
            for (double p : kProbabilities) {
              CAPTURE(shift);
              CAPTURE(consecutive);
              CAPTURE(min_scale);
              CAPTURE(raise);
              CAPTURE(window);
              CAPTURE(p);
              peer::DeepSpeed ds{};
              ds.cur_scale = 16, ds.scale_window = window, ds.min_scale = min_scale;
              ds.delayed_shift = shift, ds.cur_hysteresis = shift;
              ds.consecutive_hysteresis = consecutive, ds.raise_error_at_min_scale = raise;
              const auto opts = GradScalerOptions::deepspeed()
                                    .init_scale(16)
                                    .growth_interval(window)
                                    .min_scale(min_scale)
                                    .hysteresis(shift)
                                    .consecutive_hysteresis(consecutive)
                                    .raise_at_min_scale(raise);
              compare(opts, {[&](bool o) { ds.update_scale(o); }, [&] { return ds.cur_scale; }}, p,
                      2000, seed++);
            }
}

TEST_CASE("megatron: equal to DynamicGradScaler bit for bit") {
  unsigned seed = 100;
  for (std::int64_t hysteresis : {1, 2, 3})
    for (double min_scale : {1.0, 0.25})
      for (std::int64_t interval : {1, 2, 5})
        for (double backoff : {0.5, 0.3})
          for (double p : kProbabilities) {
            CAPTURE(hysteresis);
            CAPTURE(min_scale);
            CAPTURE(interval);
            CAPTURE(backoff);
            CAPTURE(p);
            peer::Megatron m{};
            m.scale = 1000.5f, m.min_scale = float(min_scale), m.backoff_factor = float(backoff);
            m.growth_interval = interval, m.hysteresis = hysteresis;
            m.hysteresis_tracker = hysteresis;
            const auto opts = GradScalerOptions::megatron()
                                  .init_scale(1000.5)
                                  .min_scale(min_scale)
                                  .backoff_factor(backoff)
                                  .growth_interval(interval)
                                  .hysteresis(hysteresis);
            compare(opts, {[&](bool o) { m.update(o); }, [&] { return double(m.scale); }}, p, 2000,
                    seed++);
          }
}

TEST_CASE("apex: equal to LossScaler bit for bit") {
  unsigned seed = 200;
  for (double min_scale : {0.0, 1.0})
    for (double max_scale : {16777216.0, 1024.0})
      for (std::int64_t window : {1, 2, 5})
        for (double p : kProbabilities) {
          CAPTURE(min_scale);
          CAPTURE(max_scale);
          CAPTURE(window);
          CAPTURE(p);
          peer::Apex a{};
          a.loss_scale = 4096, a.scale_seq_len = window;
          a.min_loss_scale = min_scale, a.max_loss_scale = max_scale;
          const auto opts = GradScalerOptions::apex()
                                .init_scale(4096)
                                .growth_interval(window)
                                .min_scale(min_scale)
                                .max_scale(max_scale);
          compare(opts, {[&](bool o) { a.update_scale(o); }, [&] { return a.loss_scale; }}, p, 2000,
                  seed++);
        }
}

TEST_CASE("colossalai: equal to DynamicGradScaler bit for bit") {
  unsigned seed = 300;
  for (std::int64_t hysteresis : {0, 1, 2})
    for (double min_scale : {0.0, 1.0})
      for (double max_scale : {double(INFINITY), 1048576.0})
        for (std::int64_t interval : {1, 3})
          for (double p : kProbabilities) {
            CAPTURE(hysteresis);
            CAPTURE(min_scale);
            CAPTURE(max_scale);
            CAPTURE(interval);
            CAPTURE(p);
            peer::ColossalAI c{};
            c.scale = 65536, c.growth_interval = interval, c.hysteresis = hysteresis;
            c.min_scale = float(min_scale), c.max_scale = float(max_scale);
            const auto opts = GradScalerOptions::colossalai()
                                  .growth_interval(interval)
                                  .hysteresis(hysteresis)
                                  .min_scale(min_scale)
                                  .max_scale(max_scale);
            compare(opts, {[&](bool o) { c.update(o); }, [&] { return double(c.scale); }}, p, 2000,
                    seed++);
          }
}

TEST_CASE("keras, tf and jmp: equal to their loss scales bit for bit") {
  unsigned seed = 400;
  for (std::int64_t interval : {1, 2, 5})
    for (double p : kProbabilities) {
      CAPTURE(interval);
      CAPTURE(p);
      peer::Keras k{};
      k.dynamic_growth_steps = interval;
      compare(GradScalerOptions::keras().growth_interval(interval),
              {[&](bool o) { k.apply(!o); }, [&] { return double(k.dynamic_scale); }}, p, 2000,
              seed++);
      for (double factor : {2.0, 3.0})
        for (double init : {32768.0, 0.25}) {  // below the floor: the first backoff lifts it
          CAPTURE(factor);
          CAPTURE(init);
          peer::TF t{};
          t.current_loss_scale = float(init), t.increment_period = interval;
          t.multiplier = float(factor);
          compare(GradScalerOptions::tf()
                      .init_scale(init)
                      .growth_interval(interval)
                      .growth_factor(factor)
                      .backoff_factor(1.0 / factor),
                  {[&](bool o) { t.update(!o); }, [&] { return double(t.current_loss_scale); }}, p,
                  2000, seed++);
          peer::Jmp j{};
          j.loss_scale = float(init), j.period = std::int32_t(interval), j.factor = float(factor);
          j.min_loss_scale = 0.5f;
          compare(GradScalerOptions::jmp()
                      .init_scale(init)
                      .growth_interval(interval)
                      .growth_factor(factor)
                      .backoff_factor(1.0 / factor)
                      .min_scale(0.5),
                  {[&](bool o) { j.adjust(!o); }, [&] { return double(j.loss_scale); }}, p, 2000,
                  seed++);
        }
    }
}

TEST_CASE("torch with min_scale and max_scale: torch's rule, clamped") {
  // 0.3 and 1.1 are not binary fractions: the products round in double, then the clamp applies.
  const auto opts = GradScalerOptions()
                        .init_scale(10)
                        .growth_factor(1.1)
                        .backoff_factor(0.3)
                        .growth_interval(1)
                        .min_scale(2)
                        .max_scale(12);
  ScaleState s(opts);
  s.lazy_init();
  s.update(false);
  CHECK(s.scale() == float(10.0f * 1.1));
  s.update(false);
  CHECK(s.scale() == 12.0f);  // 12.1 clamped down
  s.update(true);
  CHECK(s.scale() == float(12.0f * 0.3));
  s.update(true);
  CHECK(s.scale() == 2.0f);  // 1.08 clamped up
  s.update(true);
  CHECK(s.scale() == 2.0f);
}
