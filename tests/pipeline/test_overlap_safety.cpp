// overlap_backward as safe as the plain pipeline: an fn that throws after its step, an optimizer
// that goes before the pipeline with bucket jobs queued, a save between backward and step(), and
// an fn that changes an option the speculated steps read.
#include "overlap_fixture.h"

#include <chrono>
#include <functional>
#include <stdexcept>

using namespace ampactor;
using namespace ampactor::test::overlap;

namespace {

/// What a run leaves: the model's weights, the masters, and which calls threw (and what).
struct Outcome {
  std::vector<at::Tensor> weights, masters;
  std::vector<std::string> errors;
};

bool same(const Outcome& a, const Outcome& b) {
  if (a.errors != b.errors || a.weights.size() != b.weights.size()) return false;
  for (std::size_t i = 0; i < a.weights.size(); ++i)
    if (!test::bits_equal(a.weights[i], b.weights[i]) ||
        !test::bits_equal(a.masters[i], b.masters[i]))
      return false;
  return true;
}

/// Four iterations of Opt over the model, with or without overlap_backward; fn(k, opt) runs in
/// each step job before scaler.step, and `after(k)` after it (throwing, say).
template <class Opt, class Options>
Outcome run(bool overlap, const Options& options,
            const std::function<void(int, Opt&)>& before = nullptr,
            const std::function<void(int)>& after = nullptr) {
  Model m(at::kHalf);
  GradScaler scaler(opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
  auto o = AsyncOptimizerOptions().staleness(0);
  if (overlap) o.overlap_backward(true).bucket_bytes(24 * 24 * 4);
  AsyncOptimizer pipe(m.p, scaler, o);
  auto& opt = pipe.make_optimizer<Opt>(options);
  Outcome out;
  const auto attempt = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {  // a job's own exception comes back as it was thrown
      out.errors.push_back(e.what());
    }
  };
  for (int k = 0; k < 4; ++k) {
    m.zero_grad();
    attempt([&] { scaler.scale(m.loss(k, 0, false)).backward(); });
    attempt([&] {
      pipe.step(opt, [&, k] {
        if (before) before(k, opt);
        scaler.step(opt);
        if (after) after(k);
      });
    });
    attempt([&] { scaler.update(); });
  }
  attempt([&] { pipe.sync(); });
  out.weights = test::clones(m.p);
  out.masters = test::clones(pipe.optim_parameters());
  return out;
}

}  // namespace

TEST_CASE(
    "overlap_backward: an fn that throws after its step leaves the weights staleness 0 does") {
  const auto after = [](int k) {
    if (k == 1) throw std::runtime_error("thrown after its step");
  };
  const auto o = torch::optim::AdamOptions(1e-2);
  const Outcome plain = run<optim::FusedAdam>(false, o, nullptr, after);
  const Outcome ov = run<optim::FusedAdam>(true, o, nullptr, after);
  REQUIRE(plain.errors.size() == 1);
  CHECK(plain.errors[0].find("thrown after its step") != std::string::npos);
  CHECK(same(ov, plain));
}

TEST_CASE("overlap_backward: an optimizer that goes first runs its queued bucket jobs first") {
  for (int trial = 0; trial < 3; ++trial) {
    Model m(at::kHalf);
    GradScaler scaler(opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
    {
      AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).overlap_backward(true));
      // Declared after the pipeline: it goes first, as the scope unwinds.
      optim::FusedAdam opt(pipe.optim_parameters(), torch::optim::AdamOptions(1e-2));
      scaler.scale(m.loss(0, 0, false)).backward();
      pipe.step(opt, [&] { scaler.step(opt); });
      scaler.update();
      m.zero_grad();
      // The optimizer thread busy for a while: the buckets' jobs queue behind it.
      scaler.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); },
                    SubmitOptions().unscales(UnscalePermit::none()));
      scaler.scale(m.loss(1, 0, false)).backward();
    }  // no step(): opt goes with its bucket jobs queued (they ran first), then the pipeline
    bool alive = false;
    scaler.run_on_optimizer([&] { alive = true; });
    CHECK(alive);
    CHECK(scaler.get_scale() == 1024);
  }
}

TEST_CASE("overlap_backward: no speculated first step puts state into the live optimizer") {
  Model m(at::kHalf);
  GradScaler scaler(opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
  AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).overlap_backward(true));
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-2));
  // The optimizer is the pipeline's from its making: the buckets speculate from the first backward.
  scaler.scale(m.loss(0, 0, false)).backward();
  scaler.run_on_optimizer([&] {
    CHECK(opt.speculation_pending());  // the first steps were speculated...
    CHECK(opt.state().empty());        // ...in the second buffer alone: a save now writes none
  });
  pipe.step(opt, [&] { scaler.step(opt); });
  scaler.update();
  pipe.sync();
  CHECK(opt.state().size() == m.p.size());  // the commit installed them
  const Outcome plain = run<optim::FusedAdam>(false, torch::optim::AdamOptions(1e-2));
  const Outcome ov = run<optim::FusedAdam>(true, torch::optim::AdamOptions(1e-2));
  CHECK(same(ov, plain));
}

TEST_CASE(
    "overlap_backward: an fn that changes any option the step reads is followed, option by "
    "option") {
  using AO = torch::optim::AdamOptions;
  using O = optim::FusedAdam;
  const std::vector<std::pair<std::string, std::function<void(AO&)>>> adam = {
      {"lr", [](AO& o) { o.lr(3e-3); }},
      {"betas",
       [](AO& o) {
         o.betas({0.8, 0.99});
       }},
      {"eps", [](AO& o) { o.eps(1e-3); }},
      {"weight_decay", [](AO& o) { o.weight_decay(0.1); }},
      {"amsgrad off", [](AO& o) { o.amsgrad(false); }},
      {"amsgrad on", [](AO& o) { o.amsgrad(true); }},
  };
  for (const auto& entry : adam) {
    // Not a structured binding: clang 14 cannot capture one (CAPTURE is a lambda).
    const std::string& name = entry.first;
    const auto& change = entry.second;
    CAPTURE(name);
    const bool starts_on = name == "amsgrad off";
    const auto before = [change = change](int k, O& opt) {
      if (k == 2) change(static_cast<AO&>(opt.param_groups()[0].options()));
    };
    const Outcome plain = run<O>(false, AO(1e-2).amsgrad(starts_on), before);
    const Outcome ov = run<O>(true, AO(1e-2).amsgrad(starts_on), before);
    CHECK(same(ov, plain));
    if (name == "amsgrad on") {  // LibTorch's Adam cannot step it either: refused, by name
      REQUIRE_FALSE(plain.errors.empty());
      CHECK(plain.errors[0].find("amsgrad is on, but parameter 0's state was made without it") !=
            std::string::npos);
    } else {
      CHECK(plain.errors.empty());
    }
  }
  using SO = torch::optim::SGDOptions;
  const std::vector<std::pair<std::string, std::function<void(SO&)>>> sgd = {
      {"lr", [](SO& o) { o.lr(0.03); }},
      {"momentum", [](SO& o) { o.momentum(0.5); }},
      {"dampening", [](SO& o) { o.dampening(0.2); }},
      {"weight_decay", [](SO& o) { o.weight_decay(0.1); }},
      {"nesterov", [](SO& o) { o.nesterov(true); }},
  };
  for (const auto& entry : sgd) {
    const std::string& name = entry.first;
    const auto& change = entry.second;
    CAPTURE(name);
    const auto before = [change = change](int k, optim::FusedSGD& opt) {
      if (k == 2) change(static_cast<SO&>(opt.param_groups()[0].options()));
    };
    const Outcome plain = run<optim::FusedSGD>(false, SO(0.1).momentum(0.9), before);
    const Outcome ov = run<optim::FusedSGD>(true, SO(0.1).momentum(0.9), before);
    CHECK(plain.errors.empty());
    CHECK(same(ov, plain));
  }
}
