// The deepspeed rule against DeepSpeed itself: trajectories written by the real
// DynamicLossScaler (tests/fixtures/deepspeed/make_fixtures.py, deepspeed 0.19.8), replayed
// through ScaleState and through peer_reference.h's transcription, every step compared.
#include <doctest/doctest.h>

#include <ampactor/core/errors.h>
#include <ampactor/core/scale_state.h>

#include <set>
#include <utility>

#include "deepspeed_fixtures.h"
#include "peer_reference.h"

using namespace ampactor;
using ampactor::test::deepspeed_fixtures;
using ampactor::test::DsCase;
using ampactor::test::DsStep;
using ampactor::test::first_divergence;
namespace peer = ampactor::test::peer;

TEST_CASE("the deepspeed fixtures come from deepspeed 0.19.8 and reach every branch") {
  const auto& f = deepspeed_fixtures();
  CHECK(f.deepspeed_version == "0.19.8");
  std::set<std::int64_t> windows, shifts;
  std::set<double> min_scales;
  std::set<std::pair<bool, bool>> flags;  // consecutive_hysteresis, raise_error_at_min_scale
  std::size_t raises = 0, absorbed = 0, growths = 0, backoffs = 0, to_floor = 0, stays = 0;
  for (const DsCase& c : f.cases) {
    windows.insert(c.scale_window), shifts.insert(c.delayed_shift);
    min_scales.insert(c.min_scale);
    flags.insert({c.consecutive_hysteresis, c.raise_error_at_min_scale});
    double before = c.init_scale;
    std::int64_t hysteresis_before = c.delayed_shift;
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      const DsStep& s = c.steps[i];
      raises += s.raised;
      absorbed += s.hysteresis < hysteresis_before;
      growths += s.scale > before;
      backoffs += s.scale < before;
      to_floor += s.scale == c.min_scale && before != c.min_scale;  // clamped, or from below
      stays += c.overflow[i] && !s.raised && before == c.min_scale && s.scale == c.min_scale &&
               s.hysteresis == hysteresis_before;
      before = s.scale, hysteresis_before = s.hysteresis;
    }
  }
  CHECK(windows == std::set<std::int64_t>{1, 2, 3, 4, 5, 997, 1000});
  CHECK(shifts == std::set<std::int64_t>{1, 2, 3});
  CHECK(min_scales == std::set<double>{0.0, 0.25, 0.3, 1.0});
  CHECK(flags.size() == 4);
  CHECK(raises > 0);
  CHECK(absorbed > 0);
  CHECK(growths > 0);
  CHECK(backoffs > 0);
  CHECK(to_floor > 0);
  CHECK(stays > 0);  // at min_scale without the error
}

TEST_CASE(
    "deepspeed rule: the real DynamicLossScaler's every raise, hysteresis and scale (bit for bit, "
    "or DeepSpeed's rounded to float where it is no float)") {
  const auto& f = deepspeed_fixtures();
  for (const DsCase& c : f.cases) {
    CAPTURE(c.name);
    ScaleState s(c.options());
    s.lazy_init();
    // Where init_scale or min_scale is not a float (0.1, 0.3) DeepSpeed's double is not one
    // either: ampactor holds the float it rounds to.
    const long diverged = first_divergence(c, 0, c.all_floats(), [&](bool inf) {
      DsStep got;
      try {
        s.update(inf);
      } catch (const ScalerError& e) {
        got.raised = true;
        CHECK(e.code() == errc::scale_at_minimum);
        CHECK(std::string(e.what()) == f.raise_text);
      }
      got.scale = s.scale(), got.hysteresis = s.hysteresis_tracker();
      return got;
    });
    CHECK(diverged == -1);
  }
}

TEST_CASE("peer_reference.h's DeepSpeed: the real DynamicLossScaler's every step, bit for bit") {
  for (const DsCase& c : deepspeed_fixtures().cases) {
    CAPTURE(c.name);
    peer::DeepSpeed ds{};
    ds.cur_scale = c.init_scale, ds.scale_window = c.scale_window, ds.min_scale = c.min_scale;
    ds.delayed_shift = c.delayed_shift, ds.cur_hysteresis = c.delayed_shift;
    ds.consecutive_hysteresis = c.consecutive_hysteresis;
    ds.raise_error_at_min_scale = c.raise_error_at_min_scale;
    const long diverged = first_divergence(c, 0, /*exact=*/true, [&](bool inf) {
      DsStep got;
      try {
        ds.update_scale(inf);
      } catch (const std::runtime_error&) {
        got.raised = true;
      }
      got.scale = ds.cur_scale, got.hysteresis = ds.cur_hysteresis;
      return got;
    });
    CHECK(diverged == -1);
  }
}
