// RoundPipe's setting, timed: an fp16 MLP on the GPU, fp32 masters and Adam on the CPU
// (AsyncOptimizerOptions::master_device = CPU). The same training synchronously (staleness 0:
// the GPU waits for the CPU's step) and asynchronously (staleness 1: the CPU's step for k
// overlaps the GPU's forward/backward for k+1), with LibTorch's Adam (behind the CPU's grad move
// and the weights' cast) and with optim::FusedAdam (one pass over the pinned grads and weights),
// in one run; and FusedAdam with overlap_backward (staleness 0, exact: each bucket's grads leave
// the GPU and are stepped on the CPU while backward goes on). The micro-batches per iteration are
// chosen so that the GPU's forward+backward takes about as long as LibTorch's step, where
// staleness 1 pays most (ideal ratio 0.5); overlap_backward hides the step behind the last
// micro-batch's backward only, so it pays where that backward is longer than the step (--micro 1
// and a large --batch).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <thread>

#include "bench_setup.h"
#include "bench_util.h"

using namespace ampactor;
using namespace ampactor::bench;

namespace {

struct Settings {
  int width = 4096, layers = 4, batch = 4096, iters = 8, warmup = 2, optimizer_threads = 0;
  int micro = 0;  // 0: chosen so the GPU's work matches the CPU's step
  std::string json;
};

struct Model {
  std::vector<at::Tensor> w;
  at::Tensor x, t;
  Model(const Settings& s) {
    const auto on_gpu = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
    for (int i = 0; i < s.layers; ++i)
      w.push_back((at::randn({s.width, s.width}, on_gpu) / std::sqrt(double(s.width)))
                      .set_requires_grad(true));
    x = at::randn({s.batch, s.width}, on_gpu);
    t = at::randn({s.batch, s.width}, on_gpu);
  }
  at::Tensor loss() const {
    at::Tensor h = x;
    for (std::size_t i = 0; i < w.size(); ++i) {
      h = at::matmul(h, w[i]);
      if (i + 1 < w.size()) h = at::relu(h);
    }
    at::Tensor d = (h - t).to(at::kFloat);
    return at::mean(d * d);
  }
  void zero_grad() {
    for (auto& p : w)
      p.mutable_grad() = at::Tensor();
  }
};

/// Seconds per iteration (median) of `iters` iterations, each of `micro` forward/backward passes,
/// with the masters on the CPU at the given staleness. `in_step` gets the trainer's time inside
/// step(), `in_fn` the optimizer's time inside fn (medians, ms).
double run(const Settings& s, int micro, int staleness, bool fused, double& in_step, double& in_fn,
           bool overlap = false) {
  Model m(s);
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  AsyncOptimizerOptions o;
  o.staleness(staleness);
  o.master_device(at::Device(at::kCPU));
  o.optimizer_threads(s.optimizer_threads);
  o.overlap_backward(overlap);
  AsyncOptimizer pipe(m.w, scaler, o);
  std::unique_ptr<torch::optim::Optimizer> owned;
  if (fused)
    owned = std::make_unique<optim::FusedAdam>(pipe.optim_parameters(),
                                               torch::optim::AdamOptions(1e-4));
  else
    owned = std::make_unique<torch::optim::Adam>(pipe.optim_parameters(),
                                                 torch::optim::AdamOptions(1e-4));
  torch::optim::Optimizer& opt = *owned;
  std::vector<double> iter_ms, step_ms, fn_ms(std::size_t(s.warmup + s.iters), 0.0);
  torch::cuda::synchronize();
  Clock::time_point last = Clock::now();
  for (int k = 0; k < s.warmup + s.iters; ++k) {
    m.zero_grad();
    for (int j = 0; j < micro; ++j) {
      if (overlap) pipe.accumulate(j + 1 < micro);  // the buckets are ready in the last one
      scaler.scale(m.loss()).backward();
    }
    const Clock::time_point t0 = Clock::now();
    pipe.step(opt, [&, k] {
      const Clock::time_point f0 = Clock::now();
      scaler.step(opt);
      fn_ms[std::size_t(k)] = ms_since(f0);
    });
    step_ms.push_back(ms_since(t0));
    scaler.update();
    // A steady state is what matters: the host runs ahead of the GPU by at most a step.
    if (k >= s.warmup) iter_ms.push_back(ms_since(last));
    last = Clock::now();
  }
  pipe.sync();
  torch::cuda::synchronize();
  step_ms.erase(step_ms.begin(), step_ms.begin() + s.warmup);
  fn_ms.erase(fn_ms.begin(), fn_ms.begin() + s.warmup);
  in_step = median_of(step_ms);
  in_fn = median_of(fn_ms);
  return median_of(iter_ms);
}

/// The GPU's forward+backward alone, ms per micro-batch.
double gpu_ms(const Settings& s) {
  Model m(s);
  for (int k = 0; k < 3; ++k)
    m.loss().backward();
  torch::cuda::synchronize();
  const Clock::time_point t0 = Clock::now();
  const int n = 10;
  for (int k = 0; k < n; ++k)
    m.loss().backward();
  torch::cuda::synchronize();
  return ms_since(t0) / n;
}

/// The grads' trip to pinned host memory and the weights' trip back (fp16), ms.
double transfer_ms(const Settings& s) {
  const std::int64_t n = std::int64_t(s.layers) * s.width * s.width;
  at::Tensor dev = at::empty({n}, at::TensorOptions().device(at::kCUDA).dtype(at::kHalf));
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kHalf).pinned_memory(true));
  host.copy_(dev);
  torch::cuda::synchronize();
  const Clock::time_point t0 = Clock::now();
  host.copy_(dev, true);
  dev.copy_(host, true);
  torch::cuda::synchronize();
  return ms_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"ampactor-bench-offload: the CPU optimizer overlapped with the GPU (RoundPipe)"};
  app.add_option("--width", s.width, "hidden width")->check(CLI::Range(64, 65536));
  app.add_option("--layers", s.layers, "layers")->check(CLI::Range(1, 1000));
  app.add_option("--batch", s.batch, "rows per micro-batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro", s.micro, "micro-batches per iteration (0: match the CPU's step)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--iters", s.iters, "timed iterations per mode")->check(CLI::Range(1, 100000));
  app.add_option("--optimizer-threads", s.optimizer_threads,
                 "the optimizer thread's LibTorch threads (0: all cores but one)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--json", s.json, "write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (!torch::cuda::is_available()) {
    std::cout << "no CUDA device, or this LibTorch has no CUDA: nothing to measure\n";
    return 0;
  }
  if (s.optimizer_threads == 0)
    s.optimizer_threads = std::max(1, int(std::thread::hardware_concurrency()) - 1);
  const double params = double(s.layers) * s.width * s.width;
  std::cout << std::fixed << std::setprecision(1) << "model: " << s.layers << " x " << s.width
            << "^2 fp16 on the GPU (" << params / 1e6 << " M parameters), batch " << s.batch
            << "; fp32 masters and Adam on the CPU, " << s.optimizer_threads
            << " optimizer threads\n";
  const double gpu = gpu_ms(s);
  const double xfer = transfer_ms(s);
  int micro = s.micro;
  if (micro == 0) {  // one synchronous iteration of one micro-batch measures the CPU's side
    double step = 0, fn = 0;
    const double one = run(s, 1, 0, false, step, fn);
    micro = std::max(1, int(std::lround((one - gpu) / gpu)));
    std::cout << "calibration: one micro-batch " << gpu << " ms on the GPU, a synchronous step "
              << one << " ms: " << micro << " micro-batches per iteration\n";
  }
  const double fb = gpu * micro;
  std::cout << std::setprecision(2) << "forward+backward alone:          " << fb << " ms (" << micro
            << " x " << gpu << ")\n"
            << "grads to host + weights back:    " << xfer << " ms (fp16, pinned, one stream)\n";
  nlohmann::json j = {{"params", params}, {"micro", micro}, {"gpu_ms", fb}, {"transfer_ms", xfer}};
  for (bool fused : {false, true}) {
    const char* name = fused ? "FusedAdam" : "LibTorch Adam";
    const std::string key = fused ? "fused_" : "";
    double sync_step = 0, sync_fn = 0, async_step = 0, async_fn = 0;
    const double sync_ms = run(s, micro, 0, fused, sync_step, sync_fn);
    const double async_ms = run(s, micro, 1, fused, async_step, async_fn);
    const double ratio = async_ms / sync_ms;
    std::cout << std::setprecision(2) << name << ":\n"
              << "  synchronous  (staleness 0): " << sync_ms << " ms/iteration; trainer in step() "
              << sync_step << " ms, the step (fn) " << sync_fn << " ms\n"
              << "  asynchronous (staleness 1): " << async_ms << " ms/iteration; trainer in step() "
              << async_step << " ms, the step (fn) " << async_fn << " ms\n"
              << "  async / sync: " << std::setprecision(3) << ratio
              << "; async / forward+backward alone: " << async_ms / fb << "\n";
    j[key + "sync_ms"] = sync_ms;
    j[key + "sync_in_step_ms"] = sync_step;
    j[key + "sync_fn_ms"] = sync_fn;
    j[key + "async_ms"] = async_ms;
    j[key + "async_in_step_ms"] = async_step;
    j[key + "async_fn_ms"] = async_fn;
    j[key + "ratio"] = ratio;
    if (!fused) continue;
    double ov_step = 0, ov_fn = 0;
    const double ov_ms = run(s, micro, 0, true, ov_step, ov_fn, /*overlap=*/true);
    std::cout << std::setprecision(2) << "  overlap_backward (exact):   " << ov_ms
              << " ms/iteration; trainer in step() " << ov_step << " ms, the last job's fn "
              << ov_fn << " ms\n"
              << "  overlap / sync: " << std::setprecision(3) << ov_ms / sync_ms
              << "; overlap / forward+backward alone: " << ov_ms / fb << "\n";
    j["overlap_ms"] = ov_ms;
    j["overlap_in_step_ms"] = ov_step;
    j["overlap_fn_ms"] = ov_fn;
    j["overlap_ratio"] = ov_ms / sync_ms;
    j["overlap_over_fb"] = ov_ms / fb;
  }
  j["setup"] = ampactor::bench::run_setup();
  if (!s.json.empty()) std::ofstream(s.json) << j.dump(2) << "\n";
  return 0;
}
