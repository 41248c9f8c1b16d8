// The overlapped-backward mode (AsyncOptimizerOptions::overlap_backward) against the other
// pipelines, side by side in one run, on the CPU: an MLP (fp32 weights; --half: fp16 ones, the
// math in fp32 through a cast) whose fused Adam step takes about as long as its backward pass, the
// trainer on one core and the optimizer on the other. Modes, in an order that rotates each
// repetition:
//   fb       forward+backward alone (no step): the floor
//   sync     staleness 0: the step after backward, waited for
//   overlap  staleness 0 with overlap_backward: each bucket stepped as backward finishes it
//   async    staleness 1 with swap_weights and defer_grad_move: the step behind the next
//            forward/backward (iteration k+1 runs on the weights of step k-1)
// With --clip, three more (clip_grad_norm, the cost of clipping):
//   sync-clip        sync, clipped every step
//   overlap-measure  overlap, each bucket measured for clipping, never clipped (the norm's cost)
//   overlap-clip     overlap, clipped every step: every bucket is stepped again at step()
// Per mode: the median iteration, and the trainer's time inside step() (what is left of the
// optimizer on its path: for overlap, the tail after the last bucket and the commit).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <malloc.h>

#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <thread>

#include "bench_setup.h"
#include "bench_util.h"

using namespace ampactor;
using namespace ampactor::bench;

namespace {

struct Settings {
  int layers = 8, iters = 12, warmup = 3, reps = 3;
  std::int64_t width = 1024, batch = 0;  // 0: calibrated (see main)
  std::int64_t bucket_bytes = std::int64_t(1) << 20;
  bool half = false;  // fp16 weights, the math in fp32 through a cast (memory-bound at small batch)
  bool clip = false;  // the clip_grad_norm modes too
  std::string json;
};

struct Model {
  std::vector<at::Tensor> w;
  at::Tensor x;
  explicit Model(const Settings& s) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    for (int l = 0; l < s.layers; ++l)
      w.push_back((at::randn({s.width, s.width}, gen) / std::sqrt(double(s.width)))
                      .to(s.half ? at::kHalf : at::kFloat)
                      .set_requires_grad(true));
    x = at::randn({s.batch, s.width}, gen);
  }
  at::Tensor loss() const {
    at::Tensor h = x;
    for (const at::Tensor& p : w)
      h = at::tanh(at::matmul(h, p.scalar_type() == at::kFloat ? p : p.to(at::kFloat)));
    return (h * h).mean();
  }
  void zero_grad() {
    for (auto& p : w)
      p.mutable_grad() = at::Tensor();
  }
};

struct Timing {
  double iter_ms = 0, step_ms = 0;
};

Timing run(const Settings& s, const std::string& mode) {
  Model m(s);
  std::vector<double> iter, in_step;
  if (mode == "fb") {  // timed as the others: from one iteration's end to the next's
    Clock::time_point last = Clock::now();
    for (int k = 0; k < s.warmup + s.iters; ++k) {
      m.zero_grad();
      m.loss().backward();
      if (k >= s.warmup) iter.push_back(ms_since(last));
      last = Clock::now();
    }
    return {median_of(iter), 0};
  }
  GradScaler scaler(GradScalerOptions().init_scale(1024).allow_fp16_grads(true));
  AsyncOptimizerOptions o;
  o.optimizer_threads(1);
  if (mode == "async") o.staleness(1).swap_weights(true).defer_grad_move(true);
  if (mode.rfind("sync", 0) == 0 || mode.rfind("overlap", 0) == 0) o.staleness(0);
  if (mode.rfind("overlap", 0) == 0) o.overlap_backward(true).bucket_bytes(s.bucket_bytes);
  // A max_norm every step exceeds, or none does (measured only).
  if (mode.find("-clip") != std::string::npos) o.clip_grad_norm(1e-6);
  if (mode == "overlap-measure") o.clip_grad_norm(1e30);
  AsyncOptimizer pipe(m.w, scaler, o);
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-4),
                                                    optim::FusedOptions().threads(1));
  Clock::time_point last = Clock::now();
  for (int k = 0; k < s.warmup + s.iters; ++k) {
    m.zero_grad();
    scaler.scale(m.loss()).backward();
    const Clock::time_point t0 = Clock::now();
    pipe.step(opt, [&] { scaler.step(opt); });
    const double st = ms_since(t0);
    scaler.update();
    if (k >= s.warmup) iter.push_back(ms_since(last)), in_step.push_back(st);
    last = Clock::now();
  }
  pipe.sync();
  return {median_of(iter), median_of(in_step)};
}

/// The fused step alone (the optimizer's side): one FusedAdam step over the model's masters.
double step_ms(const Settings& s) {
  Model m(s);
  std::vector<at::Tensor> masters;
  for (const at::Tensor& p : m.w)
    masters.push_back(p.detach().to(at::kFloat).clone().set_requires_grad(true));
  optim::FusedAdam opt(masters, torch::optim::AdamOptions(1e-4), optim::FusedOptions().threads(1));
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : m.w)
    grads.push_back(at::randn(p.sizes()).to(p.scalar_type()));
  std::vector<double> t;
  for (int k = 0; k < s.warmup + s.iters; ++k) {
    const Clock::time_point t0 = Clock::now();
    opt.step_scaled(optim::ScaledStep().inv_scale(1.0f / 1024).grads(grads).weights(m.w));
    if (k >= s.warmup) t.push_back(ms_since(t0));
  }
  return median_of(t);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"ampactor-bench-overlap-backward: overlap_backward against sync, async and fb"};
  app.add_option("--layers", s.layers, "layers")->check(CLI::Range(1, 1000));
  app.add_option("--width", s.width, "width")->check(CLI::Range(8, 1 << 16));
  app.add_option("--batch", s.batch,
                 "rows per batch (0: the largest power of two whose forward+backward takes at "
                 "most 1.5x the fused step, i.e. a backward about as long as the step)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--iters", s.iters, "timed iterations per mode")->check(CLI::Range(1, 100000));
  app.add_option("--reps", s.reps, "repetitions (the order rotates)")->check(CLI::Range(1, 100));
  app.add_option("--bucket-bytes", s.bucket_bytes, "overlap's bucket size in bytes of masters")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  app.add_flag("--clip", s.clip,
               "also the clip_grad_norm modes (sync-clip, overlap-measure, overlap-clip)");
  app.add_flag("--half", s.half, "fp16 weights (the math in fp32 through a cast per use)");
  app.add_option("--json", s.json, "write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  // Keep freed gradients in the heap: glibc otherwise maps and unmaps each large one, and the
  // page faults cost as much as the arithmetic here, in every mode alike.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);  // the trainer on one core; the optimizer thread takes another
  at::get_num_threads();   // LibTorch's per-thread lazy set-up, before any other thread's
  const double params = double(s.layers) * double(s.width * s.width);
  std::cout << "model: " << s.layers << " x " << s.width << "^2 " << (s.half ? "fp16" : "fp32")
            << " weights (" << std::setprecision(3) << params / 1e6 << " M parameters), batch "
            << s.batch << "; FusedAdam, one thread each side\n";
  const double step = step_ms(s);
  if (s.batch == 0) {
    for (std::int64_t b = 1024; b >= 1; b /= 2) {
      Settings probe = s;
      probe.batch = b, probe.iters = 3, probe.warmup = 1;
      const double fb = run(probe, "fb").iter_ms;
      if (fb <= 1.5 * step || b == 1) {
        s.batch = b;
        std::cout << "calibration: batch " << b << ", forward+backward " << std::fixed
                  << std::setprecision(2) << fb << " ms, the fused step " << step << " ms\n";
        break;
      }
    }
  }
  std::vector<std::string> modes = {"fb", "sync", "overlap", "async"};
  if (s.clip) modes.insert(modes.end(), {"sync-clip", "overlap-measure", "overlap-clip"});
  std::map<std::string, std::vector<double>> iter, in_step;
  for (int r = 0; r < s.reps; ++r)
    for (std::size_t j = 0; j < modes.size(); ++j) {
      const std::string& mode = modes[(j + std::size_t(r)) % modes.size()];
      const Timing t = run(s, mode);
      iter[mode].push_back(t.iter_ms);
      in_step[mode].push_back(t.step_ms);
      std::cout << "  rep " << r << " " << std::left << std::setw(16) << mode << std::right
                << std::fixed << std::setprecision(2) << t.iter_ms << " ms/iteration, in step() "
                << t.step_ms << " ms" << std::endl;
    }
  nlohmann::json j = {{"params", params}, {"step_alone_ms", step}, {"layers", s.layers},
                      {"width", s.width}, {"batch", s.batch},      {"reps", s.reps}};
  std::cout << std::fixed << std::setprecision(2) << "the fused step alone: " << step << " ms\n";
  for (const auto& mode : modes) {
    const double ms = median_of(iter[mode]), st = median_of(in_step[mode]);
    j[mode + "_ms"] = ms;
    j[mode + "_in_step_ms"] = st;
    std::cout << std::left << std::setw(16) << mode << std::right << std::setw(8) << ms
              << " ms/iteration (" << std::setprecision(3) << ms / median_of(iter["fb"])
              << "x forward+backward), in step() " << std::setprecision(2) << st << " ms\n";
  }
  const double fb = median_of(iter["fb"]), ov = median_of(iter["overlap"]),
               as = median_of(iter["async"]);
  j["ratio_overlap_vs_fb"] = ov / fb;
  j["ratio_overlap_vs_fb_met"] = ov / fb <= 1.10;
  j["ratio_overlap_vs_async"] = ov / as;
  j["ratio_overlap_vs_async_met"] = ov / as <= 1.0;
  j["hardware_threads"] = std::thread::hardware_concurrency();
  j["batch"] = s.batch;
  j["ratio_sync_vs_fb"] = median_of(iter["sync"]) / fb;
  std::cout << std::setprecision(3) << "overlap / forward+backward: " << ov / fb
            << " (goal <= 1.10: " << (ov / fb <= 1.10 ? "met" : "NOT met")
            << "); overlap / async: " << ov / as
            << " (goal <= 1.00: " << (ov / as <= 1.0 ? "met" : "NOT met") << ")\n";
  j["setup"] = ampactor::bench::run_setup();
  if (!s.json.empty()) std::ofstream(s.json) << j.dump(2) << "\n";
  return 0;
}
