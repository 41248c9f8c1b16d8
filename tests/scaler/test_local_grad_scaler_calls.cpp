// LocalGradScaler one call at a time against torch.amp.GradScaler's meaning: scale(), disabled
// mode, misuse, getters and setters, state_dict and every error text.
#include "mlp_fixture.h"

#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <limits>

#include "refusal.h"

using ampactor::test::code_of;

TEST_CASE("scale: tensors and lists, the result keeps the output dtype") {
  LocalGradScaler scaler(4.0);
  at::Tensor x = at::full({3}, 1.5f);
  CHECK(at::equal(scaler.scale(x), at::full({3}, 6.0f)));
  auto many = scaler.scale(std::vector<at::Tensor>{x, at::full({2}, 2.0, at::kDouble)});
  CHECK(at::equal(many[0], at::full({3}, 6.0f)));
  CHECK(at::equal(many[1], at::full({2}, 8.0, at::kDouble)));
  // As with torch's 0-dim scale tensor, an fp16 output stays fp16.
  CHECK(bool(scaler.scale(at::ones({2}, at::kHalf)).scalar_type() == at::kHalf));
  CHECK_THROWS_WITH_AS(scaler.scale(at::Tensor()),
                       "outputs must be a Tensor or an iterable of Tensors", ScalerError);
  CHECK_THROWS_WITH_AS(scaler.scale(std::vector<at::Tensor>{x, at::Tensor()}),
                       "outputs must be a Tensor or an iterable of Tensors", ScalerError);
}

TEST_CASE("disabled: scale returns the input, step always steps, the rest does nothing") {
  LocalGradScaler scaler(128.0, 2.0, 0.5, 1, /*enabled=*/false);
  CHECK_FALSE(scaler.is_enabled());
  at::Tensor x = at::ones({2});
  CHECK(scaler.scale(x).is_same(x));
  CHECK(scaler.get_scale() == 1.0);
  Mlp m(1);
  auto opt = sgd()(m.params());
  mse(m.forward(at::ones({1, 6})), at::zeros({1, 3})).backward();
  m.w2.mutable_grad().fill_(INFINITY);
  auto before = m.w1.clone();
  scaler.unscale_(*opt);
  CHECK(scaler.stage(*opt) == OptState::ready);
  CHECK(scaler.step(*opt).has_value());  // no inf check: optimizer.step() runs
  CHECK_FALSE(at::equal(before, m.w1));
  scaler.update();
  CHECK(scaler.state_dict().empty());
  scaler.load_state_dict(StateDict{});  // no error when disabled, as in torch
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("misuse raises torch's texts and changes nothing") {
  Mlp m(2);
  auto opt = sgd()(m.params());
  LocalGradScaler scaler(8.0);
  auto backward = [&] {
    opt->zero_grad();
    scaler.scale(mse(m.forward(at::ones({2, 6})), at::zeros({2, 3}))).backward();
  };

  SUBCASE("before the first scale()") {
    CHECK_THROWS_WITH(scaler.step(*opt), scale_not_initialized_text("step").c_str());
    CHECK_THROWS_WITH(scaler.update(), scale_not_initialized_text("update").c_str());
    CHECK_THROWS_WITH(scaler.unscale_(*opt), scale_not_initialized_text("unscale_").c_str());
    CHECK(scaler.stage(*opt) == OptState::ready);
  }
  SUBCASE("unscale_ twice") {
    backward();
    scaler.unscale_(*opt);
    auto g = m.w1.grad().clone();
    CHECK_THROWS_WITH(
        scaler.unscale_(*opt),
        "unscale_() has already been called on this optimizer since the last update().");
    CHECK(at::equal(g, m.w1.grad()));  // not divided twice
  }
  SUBCASE("unscale_ after step, step twice") {
    backward();
    scaler.step(*opt);
    auto w = m.w1.clone();
    CHECK_THROWS_WITH(scaler.unscale_(*opt), "unscale_() is being called after step().");
    CHECK_THROWS_WITH(scaler.step(*opt), "step() has already been called since the last update().");
    CHECK(at::equal(w, m.w1));
    scaler.update();
    backward();
    CHECK_NOTHROW(scaler.step(*opt));  // update() made it READY again
  }
  SUBCASE("closure") {
    backward();
    auto w = m.w1.clone();
    CHECK_THROWS_WITH(scaler.step(*opt, [] { return at::Tensor(); }),
                      "Closure use is not currently supported if GradScaler is enabled.");
    CHECK(at::equal(w, m.w1));
    CHECK(scaler.stage(*opt) == OptState::ready);
  }
  SUBCASE("no grads: no inf checks for this optimizer, none prior to update") {
    scaler.scale(at::ones({1}));
    CHECK_THROWS_WITH(scaler.step(*opt), "No inf checks were recorded for this optimizer.");
    CHECK(scaler.stage(*opt) == OptState::ready);
    CHECK_THROWS_WITH(scaler.update(), "No inf checks were recorded prior to update.");
    CHECK(scaler.get_scale() == 8.0);
  }
  SUBCASE("fp16 gradients") {
    Mlp h(3, at::kHalf);
    auto opt_h = sgd()(h.params());
    scaler.scale(at::ones({1}));
    for (auto& p : h.params())
      p.mutable_grad() = at::full(p.sizes(), 64.0, at::kHalf);
    CHECK_THROWS_WITH_AS(scaler.unscale_(*opt_h), "Attempting to unscale FP16 gradients.",
                         ScalerError);
    CHECK(code_of([&] { scaler.unscale_(*opt_h); }) == errc::fp16_grads);
    CHECK(at::equal(h.w1.grad(), at::full({6, 8}, 64.0, at::kHalf)));
    CHECK(scaler.stage(*opt_h) == OptState::ready);
    const auto o = GradScalerOptions().init_scale(8.0).allow_fp16_grads(true);  // the extension
    LocalGradScaler lenient(o);
    lenient.scale(at::ones({1}));
    lenient.unscale_(*opt_h);
    CHECK(at::equal(h.w1.grad(), at::full({6, 8}, 8.0, at::kHalf)));
  }
  SUBCASE("update(new_scale): bad tensors are refused, the tracker is kept") {
    LocalGradScaler s(8.0, 2.0, 0.5, 10);
    Mlp m2(4);
    auto o2 = sgd()(m2.params());
    for (int i = 0; i < 3; ++i) {
      o2->zero_grad();
      s.scale(mse(m2.forward(at::ones({2, 6})), at::zeros({2, 3}))).backward();
      s.step(*o2);
      s.update();
    }
    CHECK(s.get_growth_tracker() == 3);
    const char* text =
        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor "
        "with requires_grad=False.";
    CHECK_THROWS_WITH(s.update(at::ones({2})), text);
    CHECK_THROWS_WITH(s.update(at::ones({1}).requires_grad_()), text);
    CHECK_THROWS_WITH(s.update(at::ones({1}, at::kInt)), text);
    CHECK(code_of([&] { s.update(-1.0); }) == errc::bad_new_scale);
    CHECK(code_of([&] { s.update(double(NAN)); }) == errc::bad_new_scale);
    CHECK(code_of([&] { s.update(2.9e-39); }) == errc::bad_new_scale);  // 1 / it: inf as a float
    CHECK(code_of([&] { s.update(1e-46); }) == errc::bad_new_scale);    // 0 as a float
    CHECK(s.get_scale() == 8.0);
    at::Tensor t = at::full({1}, 3.0f);
    s.update(t);
    t.fill_(100.0f);  // copied: later changes do not reach the scaler
    CHECK(s.get_scale() == 3.0);
    CHECK(s.get_growth_tracker() == 3);
    s.update(0.1);
    CHECK(s.get_scale() == double(0.1f));
  }
}

TEST_CASE("getters and setters, state_dict across scalers") {
  LocalGradScaler s(256.0, 3.0, 0.25, 7);
  CHECK(s.get_growth_factor() == 3.0);
  CHECK(s.get_backoff_factor() == 0.25);
  CHECK(s.get_growth_interval() == 7);
  s.set_growth_factor(4.0);
  s.set_backoff_factor(0.125);
  s.set_growth_interval(2);
  CHECK(code_of([&] { s.set_growth_factor(1.0); }) == errc::bad_growth_factor);
  CHECK(s.get_growth_factor() == 4.0);
  auto sd = s.state_dict();  // before the first scale()
  CHECK(sd.get_double("scale") == 256.0);
  LocalGradScaler t;
  t.load_state_dict(sd);
  CHECK(t.state_dict() == sd);
  CHECK(t.get_growth_interval() == 2);
  CHECK(at::equal(t.scale(at::ones({1})), at::full({1}, 256.0f)));  // lazily created from the dict
  CHECK(code_of([&] { t.load_state_dict(StateDict{}); }) == errc::empty_state_dict);
}

TEST_CASE(
    "torch's texts: a scale beyond float's range, the constructor's factors, nothing changes") {
  auto text_of = [](auto&& fn) { return ampactor::test::refusal_of(fn).what; };
  CHECK(text_of([] { LocalGradScaler(3.5e38); }) == texts::float_overflow);
  // The constructor's refusals are torch's texts exactly.
  CHECK(text_of([] { LocalGradScaler(1024.0, 1.0); }) == texts::growth_factor);
  CHECK(text_of([] { LocalGradScaler(1024.0, 2.0, 1.0); }) == texts::backoff_factor);
  LocalGradScaler s(256.0, 2.0, 0.5, 1);
  s.scale(at::ones({1}));
  CHECK(text_of([&] { s.update(1e39); }) == texts::float_overflow);
  // torch copies a double tensor in unchecked (the scale becomes inf); ampactor refuses it with
  // the text a float gets (doc/guide/local-scaler.md: the deliberate differences).
  CHECK(text_of([&] { s.update(at::scalar_tensor(1e39, at::kDouble)); }) == texts::float_overflow);
  CHECK(s.get_scale() == 256.0);
  StateDict sd = s.state_dict();
  sd.set("scale", 1e39);
  CHECK(text_of([&] { s.load_state_dict(sd); }) == texts::float_overflow);
  CHECK(s.get_scale() == 256.0);
  s.update(std::numeric_limits<float>::max());  // float's largest scale is still one
  CHECK(s.get_scale() == double(std::numeric_limits<float>::max()));
}

TEST_CASE(
    "load_state_dict refuses a scale of 0 as a float (a scaler that never recovers) and "
    "changes nothing") {
  LocalGradScaler s(256.0, 2.0, 0.5, 3);
  const StateDict before = s.state_dict();
  for (double bad : {0.0, 1e-50}) {  // 1e-50 is 0 as a float
    CAPTURE(bad);
    StateDict sd = before;
    sd.set("scale", bad);
    CHECK_THROWS_WITH_AS(s.load_state_dict(sd),
                         doctest::Contains("state_dict['scale'] must be finite and > 0"),
                         ScalerError);
    CHECK(s.state_dict() == before);
  }
  // A subnormal float: positive, but its reciprocal is no finite float (the unscale would turn
  // every gradient into inf or NaN): refused. A tiny normal one, a scale that decayed, loads.
  StateDict tiny = before;
  tiny.set("scale", 1e-40);
  CHECK_THROWS_WITH_AS(s.load_state_dict(tiny), doctest::Contains("its reciprocal"), ScalerError);
  CHECK(s.state_dict() == before);
  tiny.set("scale", 1e-37);
  s.load_state_dict(tiny);
  CHECK(float(s.get_scale()) == 1e-37f);
}
