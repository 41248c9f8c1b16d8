// LocalGradScaler trained against torch.amp.GradScaler's meaning: the scaling harness, multiple
// optimizers, accumulation and clipping (test_local_grad_scaler_calls.cpp: one call at a time).
#include "mlp_fixture.h"

#include <torch/optim/adam.h>
// clip_grad.h is not self-contained: it needs torch::Tensor from above.
#include <torch/nn/utils/clip_grad.h>

#include <cmath>

namespace {

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

OptimizerFactory adam() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
  };
}

bool params_equal(const Mlp& a, const Mlp& b) {
  return at::equal(a.w1, b.w1) && at::equal(a.b1, b.b1) && at::equal(a.w2, b.w2);
}

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
