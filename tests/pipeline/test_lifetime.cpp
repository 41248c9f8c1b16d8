// No lifetime rule kept by declaration order: the pipeline owns its optimizer (make_optimizer),
// drains its steps before that optimizer goes, and a scaler that goes first runs every step
// before it does. Each case leaves its scope with steps in flight, by an exception too.
#include "async_optimizer_fixture.h"
#include "refusal.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

using ampactor::test::Refusal;
using ampactor::test::refusal_of;

namespace {

/// SGD that says when it is gone, so that a step that runs after it can tell.
struct Probe : torch::optim::SGD {
  Probe(std::vector<at::Tensor> params, torch::optim::SGDOptions o, std::atomic<bool>* gone)
      : torch::optim::SGD(std::move(params), o), gone_(gone) {}
  ~Probe() override { gone_->store(true); }
  std::atomic<bool>* gone_;
};

struct Watch {
  std::atomic<bool> opt_gone{false};
  std::atomic<int> steps_run{0};
  std::atomic<int> touched_after_gone{0};
};

/// Queues slow staleness-1 steps on `opt`; each checks, when it runs, that opt still exists.
void train(Mlp& model, GradScaler& scaler, AsyncOptimizer& pipe, Probe& opt, Watch& w, int n) {
  for (iteration_t k = 0; k < n; ++k) {
    model.zero_grad();
    scaler.scale(model.loss(k, false)).backward();
    pipe.step(opt, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (w.opt_gone.load()) ++w.touched_after_gone;
      scaler.step(opt);
      ++w.steps_run;
    });
    scaler.update();
  }
}

const auto kStale = AsyncOptimizerOptions().staleness(1);
const auto kSgd = torch::optim::SGDOptions(0.01);

}  // namespace

TEST_CASE("lifetime: scaler then pipeline, an exception out of the loop with steps in flight") {
  Watch w;
  Mlp model;
  CHECK_THROWS_AS(
      [&] {
        GradScaler scaler(opts(256, 2, 0.5, 1000));
        AsyncOptimizer pipe(model.p, scaler, kStale);
        Probe& opt = pipe.make_optimizer<Probe>(kSgd, &w.opt_gone);
        train(model, scaler, pipe, opt, w, 4);
        throw std::runtime_error("the trainer fails");
      }(),
      std::runtime_error);
  CHECK(w.opt_gone.load());
  CHECK(w.steps_run == 4);
  CHECK(w.touched_after_gone == 0);
}

TEST_CASE("lifetime: pipeline declared before the scaler, so the scaler goes first") {
  Watch w;
  Mlp model;
  CHECK_THROWS_AS(
      [&] {
        std::optional<AsyncOptimizer> pipe;
        GradScaler scaler(opts(256, 2, 0.5, 1000));
        pipe.emplace(model.p, scaler, kStale);
        Probe& opt = pipe->make_optimizer<Probe>(kSgd, &w.opt_gone);
        train(model, scaler, *pipe, opt, w, 4);
        throw std::runtime_error("the trainer fails");
      }(),
      std::runtime_error);
  CHECK(w.opt_gone.load());
  CHECK(w.steps_run == 4);  // the scaler ran them all before it went
  CHECK(w.touched_after_gone == 0);
}

TEST_CASE("lifetime: an optimizer of the caller's, declared before the pipeline") {
  Watch w;
  Mlp model;
  CHECK_THROWS_AS(
      [&] {
        std::optional<Probe> opt;
        GradScaler scaler(opts(256, 2, 0.5, 1000));
        AsyncOptimizer pipe(model.p, scaler, kStale);
        opt.emplace(pipe.optim_parameters(), kSgd, &w.opt_gone);
        train(model, scaler, pipe, *opt, w, 4);
        throw std::runtime_error("the trainer fails");
      }(),
      std::runtime_error);
  CHECK(w.steps_run == 4);
  CHECK(w.touched_after_gone == 0);
}

TEST_CASE(
    "lifetime: scaler and pipeline destroyed in either order by hand, with and without swapped "
    "weights") {
  for (const bool scaler_first : {false, true})
    for (const bool swap : {false, true}) {
      CAPTURE(scaler_first);
      CAPTURE(swap);
      Watch w;
      Mlp model;
      auto scaler = std::make_unique<GradScaler>(opts(256, 2, 0.5, 1000));
      // swap_weights: the pipeline holds a scoped actor in the scaler's actor system.
      auto pipe = std::make_unique<AsyncOptimizer>(
          model.p, *scaler, AsyncOptimizerOptions().staleness(1).swap_weights(swap));
      Probe& opt = pipe->make_optimizer<Probe>(kSgd, &w.opt_gone);
      train(model, *scaler, *pipe, opt, w, 3);
      if (scaler_first) {
        scaler.reset();
        CHECK(w.steps_run == 3);
        // A pipeline without its scaler refuses to go on, clearly, and changes nothing.
        const Refusal r = refusal_of([&] { pipe->sync(); });
        CHECK(r.code == errc::protocol_misuse);
        CHECK(r.mentions("GradScaler was destroyed"));
        pipe.reset();
      } else {
        pipe.reset();
        CHECK(w.steps_run == 3);
        scaler.reset();
      }
      CHECK(w.opt_gone.load());
      CHECK(w.touched_after_gone == 0);
    }
}

TEST_CASE("make_optimizer: each optimizer it makes is a new one, over the masters") {
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizer pipe(model.p, scaler);
  auto& a = pipe.make_optimizer<torch::optim::SGD>(kSgd);
  auto& b = pipe.make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3));
  CHECK(static_cast<void*>(&a) != static_cast<void*>(&b));
  CHECK(a.param_groups()[0].params().size() == pipe.optim_parameters().size());
  CHECK(a.param_groups()[0].params()[0].is_same(pipe.optim_parameters()[0]));
}

TEST_CASE("lifetime: a pipeline whose scaler is gone refuses step() and keeps the model's grads") {
  for (const bool defer : {false, true})
    for (const bool swap : {false, true}) {
      CAPTURE(defer);
      CAPTURE(swap);
      Watch w;
      Mlp model;
      auto scaler = std::make_unique<GradScaler>(opts(256, 2, 0.5, 1000));
      AsyncOptimizer pipe(model.p, *scaler,
                          AsyncOptimizerOptions(kStale).defer_grad_move(defer).swap_weights(swap));
      Probe& opt = pipe.make_optimizer<Probe>(kSgd, &w.opt_gone);
      train(model, *scaler, pipe, opt, w, 2);
      scaler->sync();
      model.zero_grad();
      model.loss(2, false).backward();  // unscaled: there is no scaler to scale it
      scaler.reset();
      const Refusal r = refusal_of([&] { pipe.step(opt, [] {}); });
      CHECK(r.code == errc::protocol_misuse);
      CHECK(r.mentions("GradScaler was destroyed"));
      for (const at::Tensor& p : model.p)
        CHECK(p.grad().defined());  // a deferred step would have taken them
    }
}
