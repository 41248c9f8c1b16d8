// The update rule, option checks, the stage machine and state_dict values: no tensors involved.
#include "doctest_torch.h"

#include <ampactor/core/errors.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/stage.h>
#include <ampactor/core/state_dict.h>

#include <cmath>
#include <limits>
#include <random>

#include "refusal.h"
#include "scale_options.h"

using namespace ampactor;
using ampactor::test::opts;

namespace {

using ampactor::test::code_of;
}  // namespace

TEST_CASE("update rule: growth 2, backoff 0.25, interval 2 (torch's update_scale test)") {
  ScaleState s(opts(4.0, 2.0, 0.25, 2));
  s.lazy_init();
  auto o = s.update(false);  // clean step: tracker 1, scale unchanged
  CHECK(s.scale() == 4.0f);
  CHECK(s.growth_tracker() == 1);
  CHECK_FALSE(o.grew);
  o = s.update(false);  // clean step: scale x2, tracker 0
  CHECK(s.scale() == 8.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK(o.grew);
  s.update(false);
  CHECK(s.growth_tracker() == 1);
  o = s.update(true);  // inf: scale x0.25, tracker 0
  CHECK(s.scale() == 2.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK(o.backed_off);
}

TEST_CASE("the scale never grows to inf (init 1e38, growth 16)") {
  ScaleState s(opts(1e38, 16.0, 0.5, 1));
  s.lazy_init();
  const float before = s.scale();
  auto o = s.update(false);
  CHECK(std::isfinite(s.scale()));
  CHECK(s.scale() == before);
  CHECK(o.growth_refused);
  CHECK_FALSE(o.grew);
  CHECK(s.growth_tracker() == 0);  // the tracker is reset even when growth is refused
}

TEST_CASE("growth compares with ==: an interval lowered below the tracker stalls growth") {
  ScaleState s(opts(1.0, 2.0, 0.5, 10));
  s.lazy_init();
  for (int i = 0; i < 5; ++i)
    s.update(false);
  CHECK(s.growth_tracker() == 5);
  s.set_growth_interval(3);
  for (int i = 0; i < 100; ++i)
    s.update(false);
  CHECK(s.scale() == 1.0f);  // stalled: the tracker went past 3
  s.update(true);
  s.update(false);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1.0f);  // backoff 0.5 then growth x2
}

TEST_CASE("products are taken in double and rounded to float once, as torch's kernel does") {
  // A non-binary factor: double(s) * 1.1 rounded differs from float(s) * float(1.1) for some s.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(1.0f, 1e6f);
  int differs_from_float_math = 0;
  for (int i = 0; i < 2000; ++i) {
    float scale = dist(rng);
    std::int32_t tracker = 0;
    const float expected = static_cast<float>(double(scale) * 1.1);
    if (expected != scale * float(1.1)) ++differs_from_float_math;
    apply_update_rule(scale, tracker, false, 1.1, 0.5, 1);
    REQUIRE(scale == expected);
    float backoff_scale = dist(rng);
    const float expected_backoff = static_cast<float>(double(backoff_scale) * 0.3);
    apply_update_rule(backoff_scale, tracker, true, 1.1, 0.3, 1);
    REQUIRE(backoff_scale == expected_backoff);
  }
  CHECK(differs_from_float_math > 0);  // the test can tell the two apart
}

TEST_CASE("inv_scale is the double reciprocal rounded to float") {
  ScaleState s(opts(3.0, 2.0, 0.5, 1));
  s.lazy_init();
  CHECK(s.inv_scale() == float(1.0 / 3.0));
}

TEST_CASE("set_scale sets the scale (rounded to float) and leaves the tracker") {
  ScaleState s(opts(8.0, 2.0, 0.5, 5));
  s.lazy_init();
  s.update(false);
  s.update(false);
  s.set_scale(0.1);
  CHECK(s.scale() == 0.1f);
  CHECK(s.growth_tracker() == 2);
}

TEST_CASE("an enabled scaler's options are checked when it is built") {
  auto bad = [](GradScalerOptions o) { return code_of([&] { o.validate(); }); };
  // Values the setters take (NaN, inf, an interval past int32 are refused there: test_options).
  // torch checks growth > 1 and backoff < 1 (with these texts); backoff <= 0, interval < 1 and
  // init_scale <= 0 are ampactor's own refusals (doc/guide/local-scaler.md: the deliberate
  // differences).
  CHECK(bad(opts(1, 1.0, 0.5, 1)) == errc::bad_growth_factor);
  CHECK(bad(opts(1, -2.0, 0.5, 1)) == errc::bad_growth_factor);
  CHECK(bad(opts(1, 2.0, 1.0, 1)) == errc::bad_backoff_factor);
  CHECK(bad(opts(1, 2.0, 0.0, 1)) == errc::bad_backoff_factor);
  CHECK(bad(opts(1, 2.0, 0.5, 0)) == errc::bad_growth_interval);
  CHECK(bad(opts(1, 2.0, 0.5, -5)) == errc::bad_growth_interval);
  CHECK(bad(opts(-1, 2.0, 0.5, 1)) == errc::bad_init_scale);
  CHECK(bad(opts(1, 2.0, 0.5, 1)) == errc{});
  // none of it for a disabled scaler, as torch
  CHECK(bad(opts(1, 0.5, 2.0, 0).enabled(false)) == errc{});
  CHECK(bad(opts(-1, 1.0, -0.5, -7).enabled(false)) == errc{});
  CHECK_THROWS_WITH_AS(opts(1, 0.9, 0.5, 1).validate(),
                       doctest::Contains("The growth factor must be > 1.0."), ScalerError);
  CHECK_THROWS_WITH_AS(opts(1, 2.0, 1.5, 1).validate(),
                       doctest::Contains("The backoff factor must be < 1.0."), ScalerError);
}

TEST_CASE("a refused setter changes nothing") {
  ScaleState s(opts(2.0, 3.0, 0.25, 7));
  const ScaleState before = s;
  CHECK(code_of([&] { s.set_growth_factor(0.5); }) == errc::bad_growth_factor);
  CHECK(code_of([&] { s.set_backoff_factor(2.0); }) == errc::bad_backoff_factor);
  CHECK(code_of([&] { s.set_growth_interval(-1); }) == errc::bad_growth_interval);
  CHECK(s == before);
}

TEST_CASE("stage machine: torch's transitions and texts") {
  CHECK_NOTHROW(check_can_unscale(OptState::ready));
  CHECK_THROWS_WITH(
      check_can_unscale(OptState::unscaled),
      "unscale_() has already been called on this optimizer since the last update().");
  CHECK_THROWS_WITH(check_can_unscale(OptState::stepped),
                    "unscale_() is being called after step().");
  CHECK_NOTHROW(check_can_step(OptState::ready));
  CHECK_NOTHROW(check_can_step(OptState::unscaled));
  CHECK_THROWS_WITH(check_can_step(OptState::stepped),
                    "step() has already been called since the last update().");
}

TEST_CASE("state_dict before initialisation reports the initial values exactly") {
  ScaleState s(opts(0.1, 2.0, 0.5, 100));
  StateDict sd = make_state_dict(s);
  CHECK(sd.get_double("scale") == 0.1);  // the double as given, not float(0.1)
  CHECK(sd.get_int("_growth_tracker") == 0);
  s.lazy_init();
  CHECK(make_state_dict(s).get_double("scale") == double(0.1f));
  CHECK(sd.size() == 5);
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    CHECK(sd.contains(key));
}

TEST_CASE("state_dict round trips, before and after initialisation") {
  ScaleState a(opts(1024.0, 3.0, 0.25, 4));
  a.lazy_init();
  a.update(false);
  a.update(false);
  a.update(true);
  a.update(false);
  ScaleState b;  // defaults, not initialised: the values become its initial values
  load_state_dict(b, make_state_dict(a));
  CHECK(make_state_dict(b) == make_state_dict(a));
  b.lazy_init();
  CHECK(b.scale() == a.scale());
  CHECK(b.growth_tracker() == a.growth_tracker());
  for (int i = 0; i < 6; ++i) {
    a.update(i == 3);
    b.update(i == 3);
  }
  CHECK(make_state_dict(b) == make_state_dict(a));
  ScaleState c;
  c.lazy_init();  // initialised: the live values change
  load_state_dict(c, make_state_dict(a));
  CHECK(c.scale() == a.scale());
  CHECK(c.growth_tracker() == a.growth_tracker());
}

TEST_CASE("load_state_dict refuses bad dicts and changes nothing") {
  ScaleState s(opts(16.0, 2.0, 0.5, 3));
  s.lazy_init();
  s.update(false);
  const ScaleState before = s;
  CHECK_THROWS_WITH_AS(load_state_dict(s, StateDict{}),
                       "The source state dict is empty, possibly because it was saved from a "
                       "disabled instance of GradScaler.",
                       ScalerError);
  const StateDict good = make_state_dict(s);
  auto with = [&](const char* key, StateDict::Value v) {
    StateDict sd = good;
    sd.set(key, v);
    return sd;
  };
  auto without = [&](const char* key) {
    StateDict sd = good;
    sd.erase(key);
    return sd;
  };
  const StateDict bad[] = {
      without("scale"),
      without("_growth_tracker"),
      with("growth_interval", 2.5),
      with("_growth_tracker", 1.0),
      with("growth_factor", 0.5),
      with("backoff_factor", 1.0),
      with("growth_interval", std::int64_t(0)),
      with("scale", NAN),
      with("scale", -1.0),
      with("scale", 2.9e-39),  // its reciprocal is not a finite float
      with("_growth_tracker", std::int64_t(-1)),
  };
  for (const StateDict& sd : bad) {
    CHECK(code_of([&] { load_state_dict(s, sd); }) == errc::bad_state_dict);
    CHECK(s == before);
  }
  CHECK_THROWS_WITH(load_state_dict(s, without("scale")), "state_dict is missing the key 'scale'");
  // An int where a float is expected is fine, as in Python.
  load_state_dict(s, with("scale", std::int64_t(64)));
  CHECK(s.scale() == 64.0f);
}

TEST_CASE("error codes have names and torch's exception kinds") {
  CHECK(std::string(to_string(errc::unscale_twice)) == "unscale_twice");
  CHECK(std::string(python_kind(errc::fp16_grads)) == "ValueError");
  CHECK(std::string(python_kind(errc::no_inf_checks_before_update)) == "AssertionError");
  CHECK(std::string(python_kind(errc::step_twice)) == "RuntimeError");
  CHECK(scale_not_initialized_text("step") ==
        "Attempted step but _scale is None.  This may indicate your script did not use "
        "scaler.scale(loss or outputs) earlier in the iteration.");
}
