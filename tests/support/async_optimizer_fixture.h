// Includes and helpers shared by the asynchronous optimizer tests.
// The asynchronous optimizer pipeline: fp32 masters, the fused grad move, staleness 0 (bit-equal
// to synchronous torch) and staleness 1 (iteration k+1 runs on the weights of step k-1).
#pragma once
#include "doctest_torch.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
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

[[maybe_unused]] bool poisoned(iteration_t k) {
  return k % 7 == 3;
}

}  // namespace

namespace {
/// SGD, Adam or AdamW over `params` (AdamW with its decoupled weight decay on); fused-adam and
/// fused-sgd (with momentum): ampactor's fused ones.
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& kind, const std::vector<at::Tensor>& params) {
  if (kind == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  if (kind == "fused-adam")
    return std::make_unique<ampactor::optim::FusedAdam>(params, torch::optim::AdamOptions(1e-2));
  if (kind == "fused-sgd")
    return std::make_unique<ampactor::optim::FusedSGD>(
        params, torch::optim::SGDOptions(0.05).momentum(0.9));
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05));
}
}  // namespace
