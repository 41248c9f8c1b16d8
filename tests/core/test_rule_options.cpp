// The update rules' options: what each kind takes (errc::bad_rule with the reason, nothing
// stored), the presets' defaults, the setters at run time, deepspeed's error at its minimum on
// the thread-free scaler and its floors, and the one warning when the scale falls below 1.
#include "doctest_torch.h"

#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/state_dict.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <iostream>
#include <sstream>

#include "refusal.h"

using namespace ampactor;
using ampactor::test::refusal_of;

TEST_CASE("each rule takes only its own options: a clear error, nothing stored") {
  struct Case {
    GradScalerOptions o;
    const char* what;
  };
  const Case cases[] = {
      {GradScalerOptions().hysteresis(2),
       "The torch rule has no hysteresis (it must be 1). Got 2."},
      {GradScalerOptions::megatron().hysteresis(0),
       "The megatron rule's hysteresis must be >= 1. Got 0."},
      {GradScalerOptions().consecutive_hysteresis(true),
       "consecutive_hysteresis and raise_at_min_scale belong to the deepspeed rule, not the torch "
       "rule."},
      {GradScalerOptions::keras().min_scale(1), "The keras rule has no min scale. Got 1."},
      {GradScalerOptions::megatron().max_scale(1e6),
       "The megatron rule has no max scale. Got 1000000."},
      {GradScalerOptions::tf().min_scale(2),
       "The tf rule's floor is fixed at 1. Got a min scale of 2."},
      {GradScalerOptions::apex().growth_factor(3),
       "The apex rule's factors are fixed at 2 and 0.5. Got 3 and 0.5."},
      {GradScalerOptions::jmp().growth_factor(4),
       "The jmp rule backs off by dividing by growth_factor: backoff_factor must be 0.25 (1 / "
       "growth_factor). Got 0.5."},
      {GradScalerOptions().min_scale(8).max_scale(4),
       "The min scale must be <= the max scale. Got 8 > 4."},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto r = refusal_of([&] { c.o.validate(); });
    CHECK(r.code == errc::bad_rule);
    CHECK(r.what == c.what);
    CHECK(refusal_of([&] { LocalGradScaler s(c.o); }).code == errc::bad_rule);
  }
  // Setters refuse values no rule could use, checked as the float they are applied as.
  GradScalerOptions o;
  CHECK(refusal_of([&] { o.min_scale(-1); }).what ==
        "The min scale must be 0 or finite and > 0 as a float. Got -1.");
  CHECK(refusal_of([&] { o.min_scale(1e-50); }).code == errc::bad_rule);  // 0 as a float
  CHECK(refusal_of([&] { o.max_scale(1e39); }).code == errc::bad_rule);   // inf as a float
  CHECK(refusal_of([&] { o.max_scale(0); }).what ==
        "The max scale must be inf or finite and > 0 as a float. Got 0.");
  CHECK(refusal_of([&] { o.hysteresis(-1); }).code == errc::bad_rule);
  CHECK(o.min_scale() == 0);
  CHECK(o.max_scale() == INFINITY);
  CHECK(o.hysteresis() == 1);
}

TEST_CASE("the presets carry each peer's defaults and validate") {
  for (const auto& o :
       {GradScalerOptions::deepspeed(), GradScalerOptions::megatron(), GradScalerOptions::apex(),
        GradScalerOptions::colossalai(), GradScalerOptions::keras(), GradScalerOptions::tf(),
        GradScalerOptions::jmp()})
    CHECK_NOTHROW(o.validate());
  const auto ds = GradScalerOptions::deepspeed();
  CHECK((ds.init_scale() == 65536 && ds.growth_interval() == 1000 && ds.hysteresis() == 2 &&
         ds.min_scale() == 1 && ds.raise_at_min_scale()));
  const auto mg = GradScalerOptions::megatron();
  CHECK((mg.init_scale() == 4294967296.0 && mg.growth_interval() == 1000 && mg.hysteresis() == 2));
  CHECK(GradScalerOptions::apex().max_scale() == 16777216.0);
  CHECK(GradScalerOptions::keras().init_scale() == 32768.0);
  CHECK(rule_from_name("colossalai") == RuleKind::colossalai);
  CHECK(!rule_from_name("fp8"));
}

TEST_CASE("at run time a one-factor rule's backoff follows its growth factor") {
  ScaleState s(GradScalerOptions::deepspeed());
  s.set_growth_factor(4);
  CHECK(s.backoff_factor() == 0.25);
  CHECK(refusal_of([&] { s.set_backoff_factor(0.5); }).code == errc::bad_rule);
  ScaleState a(GradScalerOptions::apex());
  CHECK(refusal_of([&] { a.set_growth_factor(3); }).code == errc::bad_rule);
  CHECK(a.growth_factor() == 2);
}

TEST_CASE("deepspeed at its minimum: LocalGradScaler::update throws, the state stays") {
  LocalGradScaler scaler(GradScalerOptions::deepspeed().init_scale(1).hysteresis(1));
  at::Tensor w = at::zeros({3}).set_requires_grad(true);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  scaler.scale(at::ones({1}));
  w.mutable_grad() = at::full({3}, INFINITY);
  scaler.step(opt);
  const StateDict before = scaler.state_dict();
  const auto r = refusal_of([&] { scaler.update(); });
  CHECK(r.code == errc::scale_at_minimum);
  CHECK(r.what == texts::scale_at_minimum);
  CHECK(scaler.state_dict() == before);
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE(
    "deepspeed: a min_scale that is not a float floors the scale at float(min_scale) and raises "
    "there, as DeepSpeed raises at its min_scale") {
  for (bool raise : {true, false}) {
    CAPTURE(raise);
    ScaleState s(GradScalerOptions::deepspeed()
                     .init_scale(1)
                     .hysteresis(1)
                     .min_scale(0.3)
                     .raise_at_min_scale(raise));
    s.lazy_init();
    s.update(true);
    CHECK(s.scale() == 0.5f);
    s.update(true);  // DeepSpeed: max(0.25, 0.3) = 0.3
    CHECK(s.scale() == float(0.3));
    // DeepSpeed raises here (0.3 == min_scale); without raise it stays at 0.3.
    CHECK(refusal_of([&] { s.update(true); }).code == (raise ? errc::scale_at_minimum : errc{}));
    CHECK(s.scale() == float(0.3));
  }
}

TEST_CASE(
    "deepspeed with min_scale 0: the backoff stops at smallest_scale(), a scale that loads back, "
    "there it raises, or stays") {
  CHECK_NOTHROW(check_reciprocal_finite(smallest_scale(), errc::bad_new_scale, "s"));
  CHECK_THROWS_AS(
      check_reciprocal_finite(std::nextafter(smallest_scale(), 0.0f), errc::bad_new_scale, "s"),
      ScalerError);
  for (bool raise : {true, false}) {
    CAPTURE(raise);
    const auto opts =
        GradScalerOptions::deepspeed().init_scale(1).hysteresis(1).min_scale(0).raise_at_min_scale(
            raise);
    ScaleState s(opts);
    s.lazy_init();
    int halvings = 0;
    for (int i = 0; i < 200 && refusal_of([&] { s.update(true); }).code == errc{}; ++i)
      halvings += s.scale() == std::ldexp(1.0f, -(i + 1));
    CHECK(halvings == 127);  // 1 down to 2^-127; 2^-128 is below the floor
    CHECK(s.scale() == smallest_scale());
    CHECK(refusal_of([&] { s.update(true); }).code == (raise ? errc::scale_at_minimum : errc{}));
    CHECK(s.scale() == smallest_scale());
    ScaleState loaded(opts);
    CHECK_NOTHROW(load_state_dict(loaded, make_state_dict(s)));
  }
}

TEST_CASE("the scale falling below 1 is said once on stderr") {
  std::ostringstream err;
  auto* old = std::cerr.rdbuf(err.rdbuf());
  ScaleState s(GradScalerOptions::keras().init_scale(2));
  s.lazy_init();
  for (int i = 0; i < 4; ++i)
    s.update(true);  // 1, 0.5, 0.25, 0.125
  std::cerr.rdbuf(old);
  CHECK(s.scale() == 0.125f);
  CHECK(err.str() ==
        "ampactor: the loss scale fell below 1 (0.5): gradients are now scaled down, and small "
        "ones underflow. A min_scale (GradScalerOptions) floors it.\n");
}
