// A short real run for the metrics tests and the metrics program: three fp16 parameters whose
// gradients are set by hand (every third from iteration 2 overflows in "b"), a GradScaler with
// `tap` on its keeper and an AsyncOptimizer with clip_grad_norm reporting to `pipeline_tap`.
#pragma once

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>
#include <torch/ordered_dict.h>

#include <chrono>
#include <cmath>
#include <thread>

namespace ampactor::test {

inline bool metrics_run_blows(int k) {
  return k >= 2 && (k - 2) % 3 == 0;
}
inline int metrics_run_overflows(int iterations) {
  int n = 0;
  for (int k = 0; k < iterations; ++k)
    n += metrics_run_blows(k);
  return n;
}

/// Runs `iterations` steps; norms[k] is the pipeline's grad_norm() after step k (read at
/// staleness 0 right away, at 1 after sync). sleep: between iterations (a service's pace).
inline void metrics_run(int iterations, int staleness, std::shared_ptr<KeeperTap> tap,
                        std::shared_ptr<PipelineTap> pipeline_tap,
                        std::vector<double>* norms = nullptr,
                        std::chrono::milliseconds sleep = {}) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<at::Tensor> p;
  for (std::int64_t n : {24, 7, 40})
    p.push_back((at::randn({n}, gen) / 4).to(at::kHalf).set_requires_grad(true));
  GradScaler scaler(GradScalerOptions()
                        .init_scale(1024)
                        .growth_factor(2)
                        .backoff_factor(0.5)
                        .growth_interval(2)
                        .allow_fp16_grads(true),
                    KeeperOptions().tap(std::move(tap)));
  AsyncOptimizer pipe(p, scaler,
                      AsyncOptimizerOptions().staleness(staleness).clip_grad_norm(1.0).tap(
                          std::move(pipeline_tap)));
  torch::OrderedDict<std::string, at::Tensor> names;
  for (const char* n : {"a", "b", "c"})
    names.insert(n, p[names.size()]);
  pipe.name_parameters(names);
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-2));
  for (int k = 0; k < iterations; ++k) {
    const float scale = scaler.get_scale();
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i].mutable_grad() = (at::randn(p[i].sizes(), gen) * scale).to(at::kHalf);
    if (metrics_run_blows(k)) p[1].mutable_grad()[3] = INFINITY;
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
    if (norms) {
      if (staleness == 1) pipe.sync();
      norms->push_back(pipe.grad_norm());
    }
    if (sleep.count()) std::this_thread::sleep_for(sleep);
  }
  pipe.sync();
}

}  // namespace ampactor::test
