// A tiny training workload for trajectory tests. Gradients depend only on (iteration, scale), never
// on the parameters, so a step job may run on the optimizer thread while the main thread makes
// the next gradients, without a data race, and every run sees the same gradients for the same
// scale. Overflow is scale-dependent (as fp16's would be) plus random injected inf/NaN.
#pragma once

#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <ampactor/messages/messages.h>

namespace ampactor::test {

struct Workload {
  std::uint64_t seed = 1;
  double inject_p = 0.08;

  std::vector<at::Tensor> grads(iteration_t k, float scale) const {
    std::mt19937_64 rng(seed * 1000003u + std::uint64_t(k));
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const float spike = float(1 << (rng() % 6));  // occasional large gradients
    std::vector<at::Tensor> out;
    for (std::int64_t n : {7, 15}) {
      std::vector<float> v(static_cast<std::size_t>(n));
      for (float& x : v) {
        x = normal(rng) * spike * scale;
        if (std::fabs(x) > 65504.0f) x = INFINITY;  // what an fp16 gradient would do
      }
      if (u(rng) < inject_p) v[rng() % v.size()] = (rng() % 2) ? NAN : -INFINITY;
      out.push_back(at::from_blob(v.data(), {n}).clone());
    }
    out[1] = out[1].view({5, 3});
    return out;
  }
};

/// Two parameters and an optimizer over them.
struct Net {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> opt;

  explicit Net(bool adam = false) {
    params.push_back(at::zeros({7}).set_requires_grad(true));
    params.push_back(at::zeros({5, 3}).set_requires_grad(true));
    if (adam)
      opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
    else
      opt =
          std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  void set_grads(const std::vector<at::Tensor>& g) {
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() = g[i].clone();
  }
};

/// What a run did, iteration by iteration.
struct Trajectory {
  std::vector<float> scales;
  std::vector<bool> skipped;
  std::vector<at::Tensor> params;
  double final_scale = 0;
};

inline bool same(const Trajectory& a, const Trajectory& b) {
  if (a.scales != b.scales || a.skipped != b.skipped || a.final_scale != b.final_scale)
    return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (!a.params[i].equal(b.params[i])) return false;
  return true;
}

}  // namespace ampactor::test
