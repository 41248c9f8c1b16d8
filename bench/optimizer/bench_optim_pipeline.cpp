// ampactor-bench-optim, part 2: the optimizer threads in the pipeline. AsyncOptimizer at staleness
// 0 with GradScaler on an fp16 model: the trainer's time per step with LibTorch's Adam and with
// FusedAdam, the optimizer side on 1 and on 2 threads, all side by side (each repetition runs
// every configuration in turn).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <memory>

#include "bench_util.h"

namespace ampactor::bench {

namespace {

/// LocalGradScaler steps over fp32 parameters on this thread (its LibTorch team): ms per step,
/// median of `reps`, with LibTorch's Adam and with FusedAdam.
std::pair<double, double> local_loop(const std::vector<std::int64_t>& sizes, int reps) {
  std::vector<at::Tensor> a, b, grads;
  for (std::int64_t n : sizes) {
    a.push_back(at::randn({n}).set_requires_grad(true));
    b.push_back(a.back().detach().clone().set_requires_grad(true));
    grads.push_back(at::randn({n}) * 64);
  }
  torch::optim::Adam adam(a, torch::optim::AdamOptions(1e-3));
  optim::FusedAdam fused(b, torch::optim::AdamOptions(1e-3));
  LocalGradScaler s1, s2;
  std::vector<double> ta, tb;
  for (int r = 0; r < reps + 1; ++r) {
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i].mutable_grad() = grads[i].clone(), b[i].mutable_grad() = grads[i];
    const at::Tensor loss = at::zeros({});
    auto t0 = Clock::now();
    s1.scale(loss);
    s1.step(adam);  // unscales the clone in place, then Adam
    s1.update();
    if (r > 0) ta.push_back(ms_since(t0));
    t0 = Clock::now();
    s2.scale(loss);
    s2.step(fused);  // reads the grads, unscales inside
    s2.update();
    if (r > 0) tb.push_back(ms_since(t0));
  }
  return {median_of(ta), median_of(tb)};
}

}  // namespace

nlohmann::json pipeline_threads(const std::vector<std::int64_t>& sizes, int reps) {
  // The thread-free loop before any GradScaler or AsyncOptimizer exists, and again while they do.
  const auto before = local_loop(sizes, reps);
  struct Config {
    bool fused = false;
    int threads = 1;
    std::vector<at::Tensor> model, grads;
    std::unique_ptr<GradScaler> scaler;
    std::unique_ptr<AsyncOptimizer> pipe;
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::vector<double> ms;
  };
  std::vector<Config> cs(4);
  for (std::size_t i = 0; i < cs.size(); ++i)
    cs[i].fused = i >= 2, cs[i].threads = 1 + int(i % 2);
  for (Config& c : cs) {
    for (std::int64_t n : sizes) {
      c.model.push_back((at::randn({n}) * 0.1).to(at::kHalf).set_requires_grad(true));
      c.grads.push_back((at::randn({n}) * 64).to(at::kHalf));
    }
    c.scaler = std::make_unique<GradScaler>();
    c.pipe = std::make_unique<AsyncOptimizer>(
        c.model, *c.scaler, AsyncOptimizerOptions().staleness(0).optimizer_threads(c.threads));
    if (c.fused)
      c.opt = std::make_unique<optim::FusedAdam>(c.pipe->optim_parameters(),
                                                 torch::optim::AdamOptions(1e-3),
                                                 optim::FusedOptions().threads(c.threads));
    else
      c.opt = std::make_unique<torch::optim::Adam>(c.pipe->optim_parameters(),
                                                   torch::optim::AdamOptions(1e-3));
  }
  const at::Tensor loss = at::zeros({});
  for (int r = 0; r < reps + 1; ++r)
    for (Config& c : cs) {
      const auto t0 = Clock::now();
      for (std::size_t i = 0; i < c.model.size(); ++i)
        c.model[i].mutable_grad() = c.grads[i];
      c.scaler->scale(loss);
      c.pipe->step(*c.opt, [&] { c.scaler->step(*c.opt); });
      c.scaler->update();
      if (r > 0) c.ms.push_back(ms_since(t0));
    }
  const auto after = local_loop(sizes, reps);
  nlohmann::json out = {{"local_loop",
                         {{"adam_before_ms", before.first},
                          {"fused_before_ms", before.second},
                          {"adam_with_pipelines_ms", after.first},
                          {"fused_with_pipelines_ms", after.second}}},
                        {"pipeline", nlohmann::json::array()}};
  std::cout << std::fixed << std::setprecision(2) << "\nLocalGradScaler on this thread ("
            << at::get_num_threads()
            << " LibTorch threads), fp32 parameters, ms per step: LibTorch Adam " << before.first
            << ", FusedAdam " << before.second
            << "; the same while 4 GradScalers and AsyncOptimizers exist: LibTorch Adam "
            << after.first << ", FusedAdam " << after.second << "\n";
  std::cout << "\nAsyncOptimizer, staleness 0, fp16 model, trainer's ms per step (median of "
            << reps << "), the optimizer side on 1 and 2 threads:\n";
  for (const Config& c : cs) {
    const double m = median_of(c.ms);
    std::cout << "  " << std::setw(28) << std::left
              << (c.fused ? "FusedAdam" : "LibTorch Adam (grad move)") << std::right << c.threads
              << " thread(s)  " << std::fixed << std::setprecision(2) << std::setw(8) << m
              << " ms\n";
    out["pipeline"].push_back(
        {{"optimizer", c.fused ? "fused" : "torch"}, {"threads", c.threads}, {"ms", m}});
  }
  return out;
}

}  // namespace ampactor::bench
