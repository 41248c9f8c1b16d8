// The asynchronous optimizer pipeline: fp32 masters, the fused grad move, staleness 0 (bit-equal
// to synchronous torch) and staleness 1 (iteration k+1 runs on the weights of step k-1).
#include "doctest_torch.h"

#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/async_optimizer.h>
#include <ampactor/grad_scaler.h>
#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/Parallel.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <future>
#include <random>

#include "scale_options.h"

using namespace ampactor;
using ampactor::test::opts;

namespace {

at::Tensor seeded(std::vector<std::int64_t> shape, std::uint64_t seed, float sd = 0.5f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, sd);
  std::int64_t numel = 1;
  for (auto d : shape)
    numel *= d;
  std::vector<float> v(static_cast<std::size_t>(numel));
  for (float& x : v)
    x = n(rng);
  return at::from_blob(v.data(), shape).clone();
}

/// A two-layer perceptron as plain tensors (fp32).
struct Mlp {
  std::vector<at::Tensor> p;
  Mlp() {
    p.push_back(seeded({8, 16}, 11).set_requires_grad(true));
    p.push_back(seeded({16}, 12).set_requires_grad(true));
    p.push_back(seeded({16, 4}, 13).set_requires_grad(true));
  }
  at::Tensor loss(iteration_t k, bool poison) const {
    at::Tensor x = seeded({32, 8}, 100 + std::uint64_t(k));
    if (poison) x[0][0].fill_(INFINITY);
    at::Tensor t = seeded({32, 4}, 200 + std::uint64_t(k));
    at::Tensor h = at::tanh(at::matmul(x, p[0]) + p[1]);
    at::Tensor d = at::matmul(h, p[2]) - t;
    return at::mean(d * d);
  }
  void zero_grad() {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
  }
};

bool poisoned(iteration_t k) {
  return k % 7 == 3;
}

}  // namespace

namespace {
/// SGD, Adam or AdamW over `params` (AdamW with its decoupled weight decay on).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        const std::vector<at::Tensor>& params) {
  if (kind == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05));
}
}  // namespace

TEST_CASE("staleness 0, exact policy: SGD, Adam and AdamW equal synchronous torch bit for bit") {
  const int n = 60;
  for (const char* kind : {"sgd", "adam", "adamw"}) {
    CAPTURE(std::string(kind));
    const GradScalerOptions o = opts(1024, 2, 0.5, 4);
    // The reference: the optimizer directly on the model's parameters, torch's scaler.
    Mlp ref;
    std::unique_ptr<torch::optim::Optimizer> ref_opt = make_optimizer(kind, ref.p);
    LocalGradScaler ls(o);
    for (iteration_t k = 0; k < n; ++k) {
      ref.zero_grad();
      ls.scale(ref.loss(k, poisoned(k))).backward();
      ls.step(*ref_opt);
      ls.update();
    }

    Mlp model;
    GradScaler scaler(o);
    AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().staleness(0));
    std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(kind, pipe.optim_parameters());
    int skipped = 0;
    for (iteration_t k = 0; k < n; ++k) {
      model.zero_grad();
      scaler.scale(model.loss(k, poisoned(k))).backward();
      pipe.step(*opt, [&] { scaler.step(*opt); });
      scaler.update();
    }
    pipe.sync();
    for (iteration_t k = 0; k < n; ++k)
      skipped += scaler.wait_result(k).skipped();
    CHECK(skipped == n / 7 + (n % 7 > 3));
    CHECK(scaler.get_scale() == ls.get_scale());
    for (std::size_t i = 0; i < model.p.size(); ++i) {
      CHECK(model.p[i].equal(ref.p[i]));
      CHECK(pipe.optim_parameters()[i].equal(ref.p[i]));
    }
  }
}

TEST_CASE("staleness 1: iteration k runs on the weights of step k-2, fn overlaps") {
  const int n = 12;
  bool swap = false, defer = false;  // each SUBCASE runs the test case once more
  SUBCASE("copying the weights") {}
  SUBCASE("swapping the weights") {
    swap = true;
  }
  SUBCASE("copying the weights, deferred grad move") {
    defer = true;
  }
  SUBCASE("swapping the weights, deferred grad move") {
    swap = defer = true;
  }
  CAPTURE(swap);
  CAPTURE(defer);
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler,
                      AsyncOptimizerOptions().swap_weights(swap).defer_grad_move(defer));
  CHECK(pipe.staleness() == 1);
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  std::vector<at::Tensor> used(n), after_step(n);
  // Written by jobs that may outlive their loop iteration: never a loop-local.
  std::vector<const void*> master_grad_memory(n);
  for (iteration_t k = 0; k < n; ++k) {
    used[std::size_t(k)] = model.p[0].detach().clone();  // the weights this forward runs on
    if (!defer) model.zero_grad();
    scaler.scale(model.loss(k, false)).backward();
    const void* grad_memory = model.p[0].grad().data_ptr();
    pipe.step(opt, [&, k] {
      master_grad_memory[std::size_t(k)] = pipe.optim_parameters()[0].grad().data_ptr();
      scaler.step(opt);
      after_step[std::size_t(k)] = pipe.optim_parameters()[0].detach().clone();
    });
    if (defer) {
      // The job owns the fp32 grads: the master took this one over without a copy.
      scaler.run_on_optimizer([] {});
      CHECK(master_grad_memory[std::size_t(k)] == grad_memory);
    }
    // Deferred, the step took the grads: the next backward starts from none.
    for (const at::Tensor& p : model.p)
      CHECK(p.grad().defined() == !defer);
    scaler.update();
  }
  pipe.sync();
  CHECK(used[0].equal(used[1]));  // both before any step landed
  CHECK_FALSE(used[1].equal(after_step[0]));
  for (int k = 2; k < n; ++k) {
    CAPTURE(k);
    CHECK(used[std::size_t(k)].equal(after_step[std::size_t(k - 2)]));
  }
  CHECK(model.p[0].equal(after_step[n - 1]));  // sync() publishes the last step
  if (swap) {
    // The parameter tensors stayed the model's; only their storage alternated.
    CHECK(model.p[0].requires_grad());
    for (std::size_t i = 0; i < model.p.size(); ++i)
      CHECK(model.p[i].equal(pipe.optim_parameters()[i].detach()));
  }
}

TEST_CASE("fp16 model, fp32 masters: the grad move unscales and converts in one pass") {
  GradScaler scaler(opts(1024, 2, 0.5, 1000));
  at::Tensor w = seeded({64}, 5).to(at::kHalf).set_requires_grad(true);
  AsyncOptimizer pipe({w}, scaler, AsyncOptimizerOptions().staleness(0));
  const at::Tensor& master = pipe.optim_parameters()[0];
  CHECK((master.scalar_type() == at::kFloat));
  CHECK(master.equal(w.detach().to(at::kFloat)));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.5));
  at::Tensor x = seeded({64}, 6).to(at::kHalf);
  scaler.scale(at::sum(at::mul(w, x))).backward();  // d/dw = x * 1024, in fp16
  at::Tensor model_grad = w.grad().clone();
  at::Tensor moved;
  pipe.step(opt, [&] { moved = master.grad().clone(); });
  CHECK((moved.scalar_type() == at::kFloat));
  CHECK(moved.equal(model_grad.to(at::kFloat) * (1.0f / 1024.0f)));
  scaler.step(opt);
  scaler.update();
  pipe.sync();
  CHECK((w.scalar_type() == at::kHalf));
  CHECK(w.detach().equal(master.detach().to(at::kHalf)));  // the model got the stepped weights
}

TEST_CASE("pipeline misuse: fn may not unscale") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler);
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD other(model.p, torch::optim::SGDOptions(0.05));
  scaler.scale(model.loss(0, false)).backward();
  pipe.step(opt, [&] { scaler.unscale_(other); });  // too late: the count is already known
  scaler.update();
  std::string what;
  try {
    scaler.sync();
  } catch (const ScalerError& e) {
    what = e.what();
  }
  CHECK(what.find("may not unscale") != std::string::npos);
  CHECK(scaler.get_scale() == 256.0);  // the grad move's clean unscale still made update 0
}

TEST_CASE("master_device: the model's device keeps the masters there; another device is refused") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizerOptions o;
  o.master_device(at::Device(at::kCPU));  // the model's own device: no offloading
  {
    AsyncOptimizer pipe(model.p, scaler, o);
    CHECK(pipe.optim_parameters()[0].device().is_cpu());
  }
  // Masters on a GPU for a model on the CPU: refused by value, before any device is touched.
  o.master_device(at::Device(at::kCUDA, 0));
  CHECK_THROWS_WITH_AS(AsyncOptimizer(model.p, scaler, o),
                       doctest::Contains("neither the model's device (cpu) nor the CPU"),
                       ScalerError);
}

TEST_CASE("optimizer_threads sets the optimizer thread's team size and no other") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  const int main_threads = at::get_num_threads();
  int before = 0, after = 0;
  scaler.run_on_optimizer([&] { before = at::get_num_threads(); });
  AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().optimizer_threads(1));
  scaler.run_on_optimizer([&] { after = at::get_num_threads(); });
  CHECK(after == 1);
  CHECK(at::get_num_threads() == main_threads);
  // A machine of one core cannot tell the two apart; elsewhere the default used every core.
  if (before > 1) CHECK(after < before);
}

TEST_CASE("swap_weights: a failing fn is reported once and the weights still follow the masters") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().swap_weights(true));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  int thrown = 0;
  at::Tensor after_failed_step, used_two_later;
  for (iteration_t k = 0; k < 8; ++k) {
    try {
      if (k == 5) used_two_later = model.p[0].detach().clone();
      model.zero_grad();
      scaler.scale(model.loss(k, false)).backward();
      pipe.step(opt, [&, k] {
        scaler.step(opt);
        if (k != 3) return;
        after_failed_step = pipe.optim_parameters()[0].detach().clone();
        throw std::runtime_error("fn failed after its step");
      });
      scaler.update();
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("fn failed after its step") != std::string::npos);
      ++thrown;
    }
  }
  try {
    pipe.sync();
    scaler.sync();
  } catch (const std::exception&) {
    ++thrown;
  }
  CHECK(thrown == 1);
  // Iteration 5 ran on the weights of step 3, the failed one: its spare was filled all the same.
  REQUIRE(after_failed_step.defined());
  CHECK(used_two_later.equal(after_failed_step));
  for (std::size_t i = 0; i < model.p.size(); ++i)
    CHECK(model.p[i].equal(pipe.optim_parameters()[i].detach()));
}

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
        gate.wait();
      },
      SubmitOptions().unscales(UnscalePermit::none()));
  pipe.step(opt, [&] {
    scaler.step(opt);
    ++stepped;
  });
  scaler.update();
  started.get_future().wait();
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
