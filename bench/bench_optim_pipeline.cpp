// ampactor-bench-optim, part 2: the optimizer threads in the pipeline. AsyncOptimizer at staleness
// 0 with GradScaler on an fp16 model: the trainer's time per step with LibTorch's Adam and with
// FusedAdam, the optimizer side on 1 and on 2 threads, all side by side (each repetition runs
// every configuration in turn).
#include <ampactor/async_optimizer.h>
#include <ampactor/grad_scaler.h>
#include <ampactor/optim/fused.h>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <memory>

#include "bench_util.h"

namespace ampactor::bench {

nlohmann::json pipeline_threads(const std::vector<std::int64_t>& sizes, int reps) {
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
  nlohmann::json out = nlohmann::json::array();
  std::cout << "\nAsyncOptimizer, staleness 0, fp16 model, trainer's ms per step (median of "
            << reps << "), the optimizer side on 1 and 2 threads:\n";
  for (const Config& c : cs) {
    const double m = median_of(c.ms);
    std::cout << "  " << std::setw(28) << std::left
              << (c.fused ? "FusedAdam" : "LibTorch Adam (grad move)") << std::right << c.threads
              << " thread(s)  " << std::fixed << std::setprecision(2) << std::setw(8) << m
              << " ms\n";
    out.push_back({{"optimizer", c.fused ? "fused" : "torch"}, {"threads", c.threads}, {"ms", m}});
  }
  return out;
}

}  // namespace ampactor::bench
