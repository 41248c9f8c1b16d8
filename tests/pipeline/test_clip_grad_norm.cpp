// AsyncOptimizerOptions::clip_grad_norm: the pipeline clips by the global 2-norm inside the
// step's job, as torch's clip_grad_norm_ after unscale_ would, with torch's optimizers and the
// fused ones, at staleness 0 and 1, with the scaler enabled or not.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/clip.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <string>

#include "scale_options.h"
#include "tensor_helpers.h"

using namespace ampactor;

namespace {

constexpr float kScale = 1024;

/// Three fp16 parameters whose gradients are set by hand: iteration k's, made at kScale, do not
/// depend on the weights, so every run sees the same ones. `blow`: iteration k overflows.
struct Params {
  std::vector<at::Tensor> p;
  Params() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    for (std::int64_t n : {24, 7, 40})
      p.push_back((at::randn({n}, gen) / 4).to(at::kHalf).set_requires_grad(true));
    p[2] = p[2].detach().view({8, 5}).set_requires_grad(true);
  }
  /// The true-sized gradients of iteration k, in fp32.
  std::vector<at::Tensor> true_grads(int k) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(50 + k);
    std::vector<at::Tensor> g;
    for (const at::Tensor& x : p)
      g.push_back(at::randn(x.sizes(), gen) * (k % 3 + 1));
    return g;
  }
  void set_grads(int k, bool blow = false) {
    const std::vector<at::Tensor> g = true_grads(k);
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i].mutable_grad() = (g[i] * kScale).to(at::kHalf);
    if (blow) p[1].mutable_grad()[3] = INFINITY;
  }
};

GradScaler fixed_scaler(bool enabled = true) {
  // A scale that never moves over these few iterations.
  return GradScaler(test::opts(kScale, 2, 0.5, 1000).allow_fp16_grads(true).enabled(enabled));
}

enum class Opt { torch_adam, fused_adam, torch_sgd, fused_sgd };

std::unique_ptr<torch::optim::Optimizer> make(Opt o, const std::vector<at::Tensor>& ps) {
  switch (o) {
    case Opt::torch_adam:
      return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2));
    case Opt::fused_adam:
      return std::make_unique<optim::FusedAdam>(ps, torch::optim::AdamOptions(1e-2));
    case Opt::torch_sgd:
      return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1));
    case Opt::fused_sgd:
      return std::make_unique<optim::FusedSGD>(ps, torch::optim::SGDOptions(0.1));
  }
  return nullptr;
}

double norm_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += (a[i] - b[i]).to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("clip_grad_norm: the pipeline clips as torch's clip_grad_norm_ after unscale_ (Adam)") {
  const double max_norm = 0.5;
  for (Opt kind : {Opt::torch_adam, Opt::fused_adam}) {
    CAPTURE(int(kind));
    Params m;
    GradScaler scaler = fixed_scaler();
    AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).clip_grad_norm(max_norm));
    auto opt = make(kind, pipe.optim_parameters());
    // The reference: fp32 masters, torch's unscale (the fp16 gradient times the inverse scale),
    // clip_grad_norm_, torch's Adam.
    std::vector<at::Tensor> ref;
    for (const at::Tensor& x : m.p)
      ref.push_back(x.detach().to(at::kFloat).set_requires_grad(true));
    torch::optim::Adam ref_opt(ref, torch::optim::AdamOptions(1e-2));
    for (int k = 0; k < 6; ++k) {
      m.set_grads(k);
      for (std::size_t i = 0; i < ref.size(); ++i)
        ref[i].mutable_grad() = m.p[i].grad().to(at::kFloat) * double(1.0f / kScale);
      const double torch_norm = torch::nn::utils::clip_grad_norm_(ref, max_norm);
      ref_opt.step();
      pipe.step(*opt, [&] { scaler.step(*opt); });
      scaler.update();
      CHECK(torch_norm > max_norm);  // every iteration clips
      CHECK(pipe.grad_norm() == doctest::Approx(torch_norm).epsilon(1e-6));
    }
    for (std::size_t i = 0; i < ref.size(); ++i)
      CHECK(at::allclose(pipe.optim_parameters()[i], ref[i], 1e-5, 1e-7));
  }
}

TEST_CASE("clip_grad_norm: every SGD step moves the masters by lr x max_norm, in every path") {
  const double max_norm = 0.25, lr = 0.1;
  struct Path {
    const char* name;
    AsyncOptimizerOptions o;
    Opt kind;
    bool enabled = true;
  };
  const auto s1 = AsyncOptimizerOptions().staleness(1);
  const Path paths[] = {
      {"staleness 0, torch", AsyncOptimizerOptions().staleness(0), Opt::torch_sgd},
      {"staleness 0, fused", AsyncOptimizerOptions().staleness(0), Opt::fused_sgd},
      {"staleness 1, torch", s1, Opt::torch_sgd},
      {"staleness 1, fused", s1, Opt::fused_sgd},
      {"defer_grad_move", AsyncOptimizerOptions(s1).defer_grad_move(true), Opt::torch_sgd},
      {"swap_weights + defer", AsyncOptimizerOptions(s1).defer_grad_move(true).swap_weights(true),
       Opt::fused_sgd},
      {"swap_weights", AsyncOptimizerOptions(s1).swap_weights(true), Opt::torch_sgd},
      {"overlap_backward", AsyncOptimizerOptions().staleness(0).overlap_backward(true),
       Opt::fused_sgd},
      {"scaler disabled, fused", AsyncOptimizerOptions().staleness(0), Opt::fused_sgd, false},
      {"scaler disabled, torch", s1, Opt::torch_sgd, false},
  };
  for (const Path& path : paths) {
    CAPTURE(std::string(path.name));
    Params m;
    GradScaler scaler = fixed_scaler(path.enabled);
    AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions(path.o).clip_grad_norm(max_norm));
    auto opt = make(path.kind, pipe.optim_parameters());
    for (int k = 0; k < 4; ++k) {
      const std::vector<at::Tensor> before = test::clones(pipe.optim_parameters());
      m.set_grads(k);
      if (!path.enabled)  // unscaled gradients
        for (at::Tensor& x : m.p)
          x.mutable_grad() = x.grad() / kScale;
      pipe.step(*opt, [&] { scaler.step(*opt); });
      scaler.update();
      pipe.sync();
      const double total = global_norm(m.true_grads(k), 1.0);
      CHECK(pipe.grad_norm() == doctest::Approx(total).epsilon(1e-3));  // fp16's rounding
      CHECK(norm_of(pipe.optim_parameters(), before) ==
            doctest::Approx(lr * max_norm).epsilon(1e-4));
    }
  }
}

TEST_CASE("clip_grad_norm: a step skipped for inf/NaN clips nothing and reports NaN") {
  Params m;
  GradScaler scaler = fixed_scaler();
  AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).clip_grad_norm(0.25));
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-2));
  m.set_grads(0);
  pipe.step(opt, [&] { scaler.step(opt); });
  scaler.update();
  CHECK(std::isfinite(pipe.grad_norm()));
  const std::vector<at::Tensor> before = test::clones(pipe.optim_parameters());
  m.set_grads(1, /*blow=*/true);
  pipe.step(opt, [&] { scaler.step(opt); });
  scaler.update();
  CHECK(std::isnan(pipe.grad_norm()));
  CHECK(scaler.wait_result(1).skipped());
  CHECK(test::all_same(pipe.optim_parameters(), before));
}

TEST_CASE("clip_grad_norm: clipping's global norm does not depend on the order of measuring") {
  Params m;
  m.set_grads(2);
  std::vector<at::Tensor> g;
  for (const at::Tensor& x : m.p)
    g.push_back(x.grad());
  g.insert(g.begin() + 1, at::Tensor());  // a parameter without a gradient is left out
  std::vector<double> squares;
  for (const at::Tensor& x : g)
    if (x.defined()) squares.push_back(squared_norm(x));
  CHECK(global_norm(g, 0.5, &squares) == global_norm(g, 0.5));
  squares.pop_back();
  CHECK_THROWS_AS(global_norm(g, 1.0, &squares), ScalerError);
  CHECK(clip_coefficient(3.0, 6.0) == 1.0);
  CHECK(clip_coefficient(3.0, 1.5) == doctest::Approx(0.5));
  // A fp32 gradient whose squares overflow fp32 is measured in double.
  const at::Tensor big = at::full({4}, 1e20f);
  CHECK(squared_norm(big) == doctest::Approx(4e40).epsilon(1e-6));
}
