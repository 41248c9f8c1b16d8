// LocalGradScaler against torch.amp.GradScaler's meaning: the scaling harness, multiple
// optimizers, accumulation, clipping, state_dict, disabled mode and every error text.
#include "doctest_torch.h"

#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
// clip_grad.h is not self-contained: it needs torch::Tensor from above.
#include <torch/nn/utils/clip_grad.h>

#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "refusal.h"
#include "tensor_helpers.h"

using namespace ampactor;

namespace {

/// A two-layer perceptron as plain tensors, so the test controls every parameter.
struct Mlp {
  at::Tensor w1, b1, w2;
  explicit Mlp(std::uint64_t seed, at::ScalarType dtype = at::kFloat) {
    at::manual_seed(seed);
    w1 = (at::randn({6, 8}) * 0.5).to(dtype).requires_grad_();
    b1 = at::zeros({8}).to(dtype).requires_grad_();
    w2 = (at::randn({8, 3}) * 0.5).to(dtype).requires_grad_();
  }
  std::vector<at::Tensor> params() const { return {w1, b1, w2}; }
  at::Tensor forward(const at::Tensor& x) const { return at::relu(x.mm(w1) + b1).mm(w2); }
};

struct Batch {
  at::Tensor x, y;
};

std::vector<Batch> make_data(int n, std::uint64_t seed) {
  at::manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i)
    out.push_back({at::randn({16, 6}), at::randn({16, 3})});
  return out;
}

at::Tensor mse(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).pow(2).mean();
}

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

OptimizerFactory sgd() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}
OptimizerFactory adam() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
  };
}

bool params_equal(const Mlp& a, const Mlp& b) {
  return at::equal(a.w1, b.w1) && at::equal(a.b1, b.b1) && at::equal(a.w2, b.w2);
}

using ampactor::test::code_of;

}  // namespace

// torch's _run_scaling_case: init 128, growth 2, interval 1; at `skip_iter` a gradient is
// poisoned; scale == 128 * 2^unskipped * backoff^skipped and the parameters equal an fp32 run
// without scaling that skips the same iteration. Powers of two make the comparison exact.
TEST_CASE("scaling harness: trajectory and parameters equal an fp32 control run") {
  for (const auto& [name_, factory] : {std::pair{"SGD", sgd()}, std::pair{"Adam", adam()}})
    for (bool enabled : {true, false})
      for (double poison : {double(INFINITY), double(NAN)})
        for (bool round_trip : {false, true}) {
          const char* name = name_;  // a structured binding cannot be captured (C++17)
          CAPTURE(name);
          CAPTURE(enabled);
          CAPTURE(poison);
          CAPTURE(round_trip);
          const int iters = 8, skip_iter = 3;
          auto data = make_data(iters, 99);
          Mlp control(5), scaled(5);
          auto opt_c = factory(control.params());
          auto opt_s = factory(scaled.params());
          auto scaler = std::make_unique<LocalGradScaler>(128.0, 2.0, 0.5, 1, enabled);
          int skipped = 0, unskipped = 0;
          for (int i = 0; i < iters; ++i) {
            opt_c->zero_grad();
            mse(control.forward(data[i].x), data[i].y).backward();
            if (!enabled || i != skip_iter) opt_c->step();

            opt_s->zero_grad();
            scaler->scale(mse(scaled.forward(data[i].x), data[i].y)).backward();
            if (i == skip_iter && enabled) scaled.w2.mutable_grad().fill_(poison);
            auto ret = scaler->step(*opt_s);
            const bool was_skipped = enabled && i == skip_iter;
            CHECK(ret.has_value() == !was_skipped);
            if (enabled) CHECK(scaler->found_inf(*opt_s) == std::optional<bool>(was_skipped));
            scaler->update();
            (was_skipped ? skipped : unskipped)++;
            if (round_trip && i == iters / 2) {  // resume from a checkpoint mid-run
              auto sd = scaler->state_dict();
              scaler = std::make_unique<LocalGradScaler>(1.0, 2.0, 0.5, 1, enabled);
              scaler->load_state_dict(sd);
              CHECK(scaler->state_dict() == sd);
            }
          }
          const double expected =
              enabled ? 128.0 * std::pow(2.0, unskipped) * std::pow(0.5, skipped) : 1.0;
          CHECK(scaler->get_scale() == expected);
          CHECK(params_equal(control, scaled));
        }
}

TEST_CASE("multiple optimizers: an inf in one skips only its step, the scale backs off once") {
  const int iters = 5, skip_iter = 2;
  auto data = make_data(iters, 7);
  Mlp c0(1), c1(2), s0(1), s1(2);
  auto oc0 = sgd()(c0.params()), oc1 = sgd()(c1.params());
  auto os0 = sgd()(s0.params()), os1 = sgd()(s1.params());
  LocalGradScaler scaler(128.0, 2.0, 0.25, 1);
  for (int i = 0; i < iters; ++i) {
    for (auto* o : {oc0.get(), oc1.get(), os0.get(), os1.get()})
      o->zero_grad();
    auto losses = [&](Mlp& m0, Mlp& m1) {
      at::Tensor y0 = m0.forward(data[i].x), y1 = m1.forward(data[i].x);
      return std::pair{mse(0.3 * y0 + 0.7 * y1, data[i].y), mse(0.6 * y0 - 0.4 * y1, data[i].y)};
    };
    auto [lc0, lc1] = losses(c0, c1);
    lc0.backward({}, /*retain_graph=*/true);
    lc1.backward();
    oc0->step();
    if (i != skip_iter) oc1->step();

    auto [ls0, ls1] = losses(s0, s1);
    scaler.scale(ls0).backward({}, true);
    scaler.scale(ls1).backward();
    if (i == skip_iter) s1.w2.mutable_grad().fill_(INFINITY);
    scaler.unscale_(*os0);  // one optimizer unscaled separately, as torch's test does
    CHECK(scaler.step(*os0).has_value());
    CHECK(scaler.step(*os1).has_value() == (i != skip_iter));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 128.0 * std::pow(2.0, iters - 1) * 0.25);
  CHECK(params_equal(c0, s0));
  CHECK(params_equal(c1, s1));
}

TEST_CASE("accumulation: several scaled backwards, one step, one update") {
  auto data = make_data(9, 3);
  Mlp control(4), scaled(4);
  auto oc = adam()(control.params()), os = adam()(scaled.params());
  LocalGradScaler scaler(1024.0, 2.0, 0.5, 1);
  for (int step = 0; step < 3; ++step) {
    oc->zero_grad();
    os->zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      const Batch& b = data[step * 3 + micro];
      (mse(control.forward(b.x), b.y) / 3).backward();
      scaler.scale(mse(scaled.forward(b.x), b.y) / 3).backward();
    }
    oc->step();
    scaler.step(*os);
    scaler.update();
  }
  CHECK(scaler.get_scale() == 1024.0 * 8);
  CHECK(params_equal(control, scaled));
}

TEST_CASE("clipping after unscale_: step does not unscale again") {
  auto data = make_data(4, 11);
  Mlp control(8), scaled(8);
  auto oc = sgd()(control.params()), os = sgd()(scaled.params());
  LocalGradScaler scaler(65536.0, 2.0, 0.5, 2);
  for (const Batch& b : data) {
    oc->zero_grad();
    mse(control.forward(b.x), b.y).backward();
    torch::nn::utils::clip_grad_norm_(control.params(), 0.1);
    oc->step();

    os->zero_grad();
    scaler.scale(mse(scaled.forward(b.x), b.y)).backward();
    scaler.unscale_(*os);
    torch::nn::utils::clip_grad_norm_(scaled.params(), 0.1);
    CHECK(scaler.stage(*os) == OptState::unscaled);
    scaler.step(*os);
    CHECK(scaler.stage(*os) == OptState::stepped);
    scaler.update();
    CHECK(scaler.stage(*os) == OptState::ready);
  }
  CHECK(params_equal(control, scaled));
}

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
