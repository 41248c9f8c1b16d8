// The asynchronous optimizer pipeline: staleness 0 and 1, the grad move, misuse, threads, swapped
// weights.
#include "async_optimizer_fixture.h"

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

TEST_CASE("pipeline misuse: unscale_ in fn says the grad move already unscaled, where to clip") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().staleness(0));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  scaler.scale(model.loss(0, false)).backward();
  std::string what;
  errc code = errc::step_failed;
  try {
    pipe.step(opt, [&] {
      scaler.unscale_(opt);  // the call that is refused, inside fn
      scaler.step(opt);
    });
  } catch (const ScalerError& e) {
    what = e.what();
    code = e.code();
  }
  CHECK(code == errc::unscale_twice);
  CHECK(what == std::string(texts::unscale_twice) +
                    " The pipeline's grad move unscaled this optimizer's gradients: the masters' "
                    "grads are true-sized inside fn, so clip them there without unscale_().");
}

TEST_CASE("pipeline misuse: an optimizer over the model's parameters is refused at step()") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler, AsyncOptimizerOptions().staleness(0));
  torch::optim::SGD wrong(model.p, torch::optim::SGDOptions(0.05));
  scaler.scale(model.loss(0, false)).backward();
  const at::Tensor before = model.p[0].detach().clone();
  bool ran = false;
  try {
    pipe.step(wrong, [&] { ran = true; });
    FAIL("step() accepted an optimizer over the model's parameters");
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_parameters);
    CHECK(std::string(e.what()) ==
          "AsyncOptimizer::step: the optimizer's parameter 0 is not one of optim_parameters(): "
          "build the optimizer over the pipeline's masters (optim_parameters()), not the model's "
          "parameters");
  }
  // Nothing was queued: the grads are still the model's, and the right optimizer steps.
  CHECK_FALSE(ran);
  CHECK(model.p[0].grad().defined());
  CHECK(model.p[0].detach().equal(before));
  torch::optim::SGD right(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  pipe.step(right, [&] { scaler.step(right); });
  scaler.update();
  scaler.sync();
  CHECK_FALSE(model.p[0].detach().equal(before));
}

TEST_CASE("master_device: the model's device keeps the masters there, another device is refused") {
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
