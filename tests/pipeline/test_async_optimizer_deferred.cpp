// The asynchronous optimizer pipeline: the deferred grad move and grad adoption.
#include "async_optimizer_fixture.h"

#include <iostream>
#include <sstream>

namespace {

/// Parameters, scale and skips of n staleness-1 iterations (overflow at poisoned ones).
struct Run {
  std::vector<at::Tensor> params;
  double scale = 0;
  int skipped = 0;
};

Run run_staleness_1(bool swap, bool defer, ScalePolicy policy, int n) {
  Mlp model;
  GradScaler scaler(opts(1024, 2, 0.5, 3), policy);
  AsyncOptimizer pipe(model.p, scaler,
                      AsyncOptimizerOptions().swap_weights(swap).defer_grad_move(defer));
  torch::optim::Adam opt(pipe.optim_parameters(), torch::optim::AdamOptions(1e-2));
  for (iteration_t k = 0; k < n; ++k) {
    model.zero_grad();
    scaler.scale(model.loss(k, poisoned(k))).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  Run r;
  for (iteration_t k = 0; k < n; ++k)
    r.skipped += scaler.wait_result(k).skipped();
  r.scale = scaler.get_scale();
  for (const at::Tensor& p : model.p)
    r.params.push_back(p.detach().clone());
  return r;
}

}  // namespace

TEST_CASE("defer_grad_move: the same training, bit for bit, as the waited grad move") {
  // The exact policy only: the lagged one's scales depend on timing by design.
  const int n = 30;
  for (bool swap : {false, true}) {
    CAPTURE(swap);
    const Run waited = run_staleness_1(swap, false, ScalePolicy::exact, n);
    const Run deferred = run_staleness_1(swap, true, ScalePolicy::exact, n);
    CHECK(waited.skipped >= n / 7);  // the poisoned iterations overflowed and were skipped
    CHECK(deferred.skipped == waited.skipped);
    CHECK(deferred.scale == waited.scale);
    for (std::size_t i = 0; i < waited.params.size(); ++i)
      CHECK(deferred.params[i].equal(waited.params[i]));
  }
}

TEST_CASE("defer_grad_move: fn may not unscale, a failed move abandons its update only") {
  CHECK_THROWS_AS(
      [] {
        Mlp model;
        GradScaler scaler(opts(256, 2, 0.5, 1000));
        AsyncOptimizer pipe(model.p, scaler,
                            AsyncOptimizerOptions().staleness(0).defer_grad_move(true));
      }(),
      ScalerError);
  for (bool swap : {false, true}) {
    CAPTURE(swap);
    Mlp model;
    GradScaler scaler(opts(256, 2, 0.5, 1));  // each clean update doubles the scale
    AsyncOptimizer pipe(model.p, scaler,
                        AsyncOptimizerOptions().swap_weights(swap).defer_grad_move(true));
    torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
    torch::optim::SGD other(model.p, torch::optim::SGDOptions(0.05));
    std::vector<std::string> errors;
    auto attempt = [&](auto&& f) {
      try {
        f();
      } catch (const std::exception& e) {
        errors.push_back(e.what());
      }
    };
    // Iteration 0: fn unscales an optimizer of its own: refused (the move spent the count), but
    // the move's clean unscale still makes update 0.
    scaler.scale(model.loss(0, false)).backward();
    pipe.step(opt, [&] { scaler.unscale_(other); });
    attempt([&] { scaler.update(); });
    attempt([&] { scaler.sync(); });
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].find("may not unscale") != std::string::npos);
    CHECK(scaler.get_scale() == 512.0);
    // Iteration 1: the move itself fails (a gradient of the wrong shape): update 1 changes nothing.
    at::Tensor before = pipe.optim_parameters()[0].detach().clone();
    scaler.scale(model.loss(1, false)).backward();
    model.p[0].mutable_grad() = at::ones({3});
    pipe.step(opt, [&] { scaler.step(opt); });
    attempt([&] { scaler.update(); });
    attempt([&] { scaler.sync(); });
    REQUIRE(errors.size() == 2);
    CHECK(errors[1].find("does not have its master's shape") != std::string::npos);
    CHECK(scaler.get_scale() == 512.0);
    CHECK(pipe.optim_parameters()[0].equal(before));
    // Iteration 2 trains on; the model follows the masters, the spare included.
    scaler.scale(model.loss(2, false)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
    pipe.sync();
    CHECK(scaler.get_scale() == 1024.0);
    CHECK_FALSE(pipe.optim_parameters()[0].equal(before));
    for (std::size_t i = 0; i < model.p.size(); ++i)
      CHECK(model.p[i].equal(pipe.optim_parameters()[i].detach()));
  }
}

TEST_CASE("grad move with adopt: sole fp32 grads are unscaled in place and kept, others copied") {
  for (bool poison : {false, true}) {
    CAPTURE(poison);
    std::vector<at::Tensor> masters;
    for (int i = 0; i < 5; ++i)
      masters.push_back(at::zeros({6, 4}).set_requires_grad(true));
    torch::optim::SGD opt(masters, torch::optim::SGDOptions(0.1));
    at::Tensor big = seeded({12, 4}, 30);
    std::vector<at::Tensor> grads = {
        seeded({6, 4}, 31),                // sole, fp32, contiguous: adopted
        seeded({6, 4}, 32),                // the caller keeps a reference: copied
        seeded({4, 6}, 33).t(),            // transposed: copied
        seeded({6, 4}, 34).to(at::kHalf),  // fp16: converted
        big.narrow(0, 3, 6),               // a view of a tensor kept elsewhere: copied
    };
    if (poison) grads[0][1][2].fill_(INFINITY);
    const at::Tensor kept = grads[1];
    std::vector<at::Tensor> expect;
    std::vector<const void*> before;
    for (const at::Tensor& g : grads) {
      expect.push_back(g.to(at::kFloat) * 0.25f);
      before.push_back(g.data_ptr());
    }
    const at::Tensor kept_before = kept.clone(), big_before = big.clone();
    StepTracker tracker(true);
    CHECK(tracker.move_and_unscale_(opt, grads, masters, 0.25f, /*adopt=*/true) == poison);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      REQUIRE(masters[i].grad().defined());
      CHECK((masters[i].grad().scalar_type() == at::kFloat));
      CHECK(masters[i].grad().equal(expect[i]));  // inf stays inf
      CHECK((masters[i].grad().data_ptr() == before[i]) == (i == 0));
    }
    CHECK(kept.equal(kept_before));  // what the caller still holds is untouched
    CHECK(big.equal(big_before));
    // Without adopt nothing is taken over.
    std::vector<at::Tensor> masters2;
    for (int i = 0; i < 1; ++i)
      masters2.push_back(at::zeros({6, 4}).set_requires_grad(true));
    torch::optim::SGD opt2(masters2, torch::optim::SGDOptions(0.1));
    std::vector<at::Tensor> g2 = {seeded({6, 4}, 35)};
    const void* p2 = g2[0].data_ptr();
    const at::Tensor g2_before = g2[0].clone();
    StepTracker t2(true);
    t2.move_and_unscale_(opt2, g2, masters2, 0.25f);
    CHECK(masters2[0].grad().data_ptr() != p2);
    CHECK(g2[0].equal(g2_before));
  }
}

TEST_CASE(
    "defer_grad_move + swap_weights: a step job dropped by cancel() neither hangs nor loses") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1));  // each clean update doubles the scale
  AsyncOptimizer pipe(model.p, scaler,
                      AsyncOptimizerOptions().swap_weights(true).defer_grad_move(true));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  int stepped = 0;
  // Iteration 0 steps normally.
  scaler.scale(model.loss(0, false)).backward();
  pipe.step(opt, [&] {
    scaler.step(opt);
    ++stepped;
  });
  scaler.update();
  // Iteration 1: its step job waits behind a gated job and is cancelled before it runs.
  std::promise<void> started, release;
  std::shared_future<void> gate = release.get_future().share();
  scaler.scale(model.loss(1, false)).backward();
  scaler.submit(
      [&] {
        started.set_value();
        gate.wait_for(std::chrono::seconds(30));
      },
      SubmitOptions().unscales(UnscalePermit::none()));
  pipe.step(opt, [&] {
    scaler.step(opt);
    ++stepped;
  });
  scaler.update();
  REQUIRE(started.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  scaler.cancel();
  release.set_value();
  const at::Tensor after_step_0 = [&] {
    scaler.sync();
    return pipe.optim_parameters()[0].detach().clone();
  }();
  CHECK(stepped == 1);
  CHECK(scaler.wait_result(1).cancelled_jobs == 1);
  CHECK(scaler.get_scale() == 512.0);  // update 0 doubled it; the dropped update 1 changed nothing
  // Iteration 2: the dropped job's spare was never filled; step() takes the masters instead.
  scaler.scale(model.loss(2, false)).backward();
  pipe.step(opt, [&] {
    scaler.step(opt);
    ++stepped;
  });
  CHECK(model.p[0].equal(after_step_0));  // the forward of iteration 3 runs on step 0's weights
  scaler.update();
  pipe.sync();
  CHECK(stepped == 2);
  CHECK(scaler.get_scale() == 1024.0);
  for (std::size_t i = 0; i < model.p.size(); ++i)
    CHECK(model.p[i].equal(pipe.optim_parameters()[i].detach()));
}

TEST_CASE("defer_grad_move with a disabled scaler: the grads move unscaled, as without it") {
  std::vector<std::vector<at::Tensor>> got;
  for (bool defer : {false, true}) {
    CAPTURE(defer);
    Mlp model;
    GradScaler scaler(GradScalerOptions().enabled(false));
    AsyncOptimizer pipe(model.p, scaler,
                        AsyncOptimizerOptions().swap_weights(true).defer_grad_move(defer));
    torch::optim::Adam opt(pipe.optim_parameters(), torch::optim::AdamOptions(1e-2));
    for (iteration_t k = 0; k < 6; ++k) {
      model.zero_grad();
      scaler.scale(model.loss(k, false)).backward();
      pipe.step(opt, [&] { scaler.step(opt); });
      scaler.update();
    }
    pipe.sync();
    std::vector<at::Tensor> p;
    for (const at::Tensor& t : model.p)
      p.push_back(t.detach().clone());
    got.push_back(p);
  }
  CHECK_FALSE(got[0][0].equal(Mlp().p[0].detach()));  // it trained
  for (std::size_t i = 0; i < got[0].size(); ++i)
    CHECK(got[1][i].equal(got[0][i]));
}

TEST_CASE("step() warns once when the model's gradients were added to the last step's") {
  // opt.zero_grad() clears the masters' gradients, which the pipeline never reads; the model's
  // own then grow step after step. Cleared in place or set to none, nothing is said.
  auto stderr_of = [](int how) {  // 0: the optimizer's zero_grad, 1: the model's, 2: in place
    Mlp model;
    GradScaler scaler(opts(1024, 2, 0.5, 100));
    AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().staleness(0));
    torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.01));
    std::ostringstream err;
    std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
    for (iteration_t k = 0; k < 4; ++k) {
      if (how == 0) opt.zero_grad();
      if (how == 1) model.zero_grad();
      if (how == 2)
        for (at::Tensor& p : model.p)
          if (p.grad().defined()) p.mutable_grad().zero_();
      scaler.scale(model.loss(k, false)).backward();
      pipe.step(opt, [&] { scaler.step(opt); });
      scaler.update();
    }
    pipe.sync();
    std::cerr.rdbuf(old);
    return err.str();
  };
  const std::string said = stderr_of(0);
  const std::string what = "the model's gradient 0 was added to the last step's";
  CHECK(said.find(what) != std::string::npos);
  CHECK(said.find(what) == said.rfind(what));  // once
  CHECK(stderr_of(1).empty());
  CHECK(stderr_of(2).empty());
}
