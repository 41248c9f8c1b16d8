// The model the LocalGradScaler tests train (test_local_grad_scaler.cpp and
// test_local_grad_scaler_calls.cpp): a two-layer perceptron, its loss, and SGD's factory.
#pragma once
#include "doctest_torch.h"

#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <vector>

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

}  // namespace
