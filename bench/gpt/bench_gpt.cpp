// A small GPT (bench/gpt/gpt_model.h) trained in fp16 on the GPU with ampactor, for the comparison
// with PyTorch's own GradScaler and fused AdamW (bench/gpt/gpt_torch.py runs that side on the same
// weights and batches; bench/gpt/gpt_torch.py --compare puts the runs side by side). Modes:
//   gpu            the masters and AdamW on the GPU, AsyncOptimizer at staleness 0
//   offload        the masters and optim::FusedAdamW on the CPU (RoundPipe's setting), staleness 0
//   offload-async  the same at staleness 1 (the CPU's step overlaps the next forward/backward)
//   offload-overlap  offload with overlap_backward: each bucket stepped on the CPU as backward
//                  finishes its grads, committed at step() (exact: offload's trajectory)
// Each mode writes OUT/MODE.csv (iteration, loss, scale, skipped) and a line of OUT/summary.csv.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/stack.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include "bench_util.h"
#include "gpt_model.h"

using namespace ampactor;
using namespace ampactor::bench;

namespace {

struct Settings {
  GptShape shape;
  std::int64_t batch = 32;
  int steps = 300, warmup = 20, growth_interval = 10, optimizer_threads = 0;
  double lr = 1e-3, weight_decay = 0.01;
  std::uint64_t seed = 1;
  bool deterministic = false;
  std::string text, out = "out/gpt";
  std::vector<std::string> modes = {"gpu", "offload", "offload-async", "offload-overlap"};
};

struct Summary {
  std::string mode;
  double tokens_per_s = 0, eval_loss = 0, final_scale = 0;
  int skipped = 0;
};

double eval_loss(const std::vector<at::Tensor>& w, const GptCorpus& corpus, const Settings& s) {
  at::AutoGradMode no_grad(false);
  std::uint64_t state = s.seed + 999;
  double sum = 0;
  const int batches = 8;
  for (int i = 0; i < batches; ++i) {
    auto [x, y] = corpus.batch(state, s.batch, s.shape.context, true);
    sum += gpt_loss(w, s.shape, x.to(at::kCUDA), y.to(at::kCUDA)).item<double>();
  }
  return sum / batches;
}

Summary run(const std::string& mode, const GptCorpus& corpus, const Settings& s) {
  std::vector<at::Tensor> w = gpt_init(s.shape, s.seed, at::kHalf, at::kCUDA);
  GradScaler scaler(GradScalerOptions().growth_interval(s.growth_interval).allow_fp16_grads(true));
  AsyncOptimizerOptions o;
  o.staleness(mode == "offload-async" ? 1 : 0).optimizer_threads(s.optimizer_threads);
  if (mode != "gpu") o.master_device(at::Device(at::kCPU));
  if (mode == "offload-overlap") o.overlap_backward(true);
  AsyncOptimizer pipe(w, scaler, o);
  const auto adamw = torch::optim::AdamWOptions(s.lr).weight_decay(s.weight_decay);
  torch::optim::Optimizer& opt =
      mode == "gpu"
          ? static_cast<torch::optim::Optimizer&>(pipe.make_optimizer<torch::optim::AdamW>(adamw))
          : pipe.make_optimizer<optim::FusedAdamW>(adamw);
  std::uint64_t state = s.seed;
  std::vector<at::Tensor> losses;
  std::vector<double> scales;
  Clock::time_point t0;
  for (int k = 0; k < s.steps; ++k) {
    if (k == s.warmup) {
      torch::cuda::synchronize();
      t0 = Clock::now();
    }
    auto [xc, yc] = corpus.batch(state, s.batch, s.shape.context, false);
    for (auto& p : w)
      p.mutable_grad() = at::Tensor();
    const at::Tensor loss = gpt_loss(w, s.shape, xc.to(at::kCUDA), yc.to(at::kCUDA));
    scaler.scale(loss).backward();
    scales.push_back(scaler.get_scale());
    losses.push_back(loss.detach());
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  torch::cuda::synchronize();
  const double secs = ms_since(t0) / 1e3;
  Summary sum{mode};
  sum.tokens_per_s = double(s.steps - s.warmup) * double(s.batch * s.shape.context) / secs;
  const at::Tensor l = at::stack(losses).cpu();
  std::ofstream csv(s.out + "/" + mode + ".csv");
  csv << "iteration,loss,scale,skipped\n";
  for (int k = 0; k < s.steps; ++k) {
    const bool skipped = scaler.wait_result(k).skipped();
    sum.skipped += skipped;
    csv << k << ',' << std::setprecision(9) << l[k].item<float>() << ',' << scales[std::size_t(k)]
        << ',' << int(skipped) << '\n';
  }
  if (!csv) throw std::runtime_error("cannot write " + s.out + "/" + mode + ".csv");
  sum.final_scale = scaler.get_scale();
  sum.eval_loss = eval_loss(w, corpus, s);
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"ampactor-bench-gpt: a small GPT in fp16 on the GPU, trained with ampactor"};
  app.add_option("--text", s.text, "the text file to train on (>= 100 kB)")->required();
  app.add_option("--out", s.out, "output folder (must exist)");
  app.add_option("--steps", s.steps, "iterations per mode")->check(CLI::Range(2, 1000000));
  app.add_option("--warmup", s.warmup, "iterations before the clock starts")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--batch", s.batch, "sequences per iteration")->check(CLI::Range(1, 1 << 16));
  app.add_option("--context", s.shape.context, "characters per sequence")
      ->check(CLI::Range(2, 1 << 16));
  app.add_option("--embed", s.shape.embed, "width (a multiple of 64: heads of 64)")
      ->check(CLI::Range(64, 1 << 16));
  app.add_option("--layers", s.shape.layers, "blocks")->check(CLI::Range(1, 1000));
  app.add_option("--lr", s.lr, "AdamW's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "seed of the weights and the batches");
  app.add_option("--growth-interval", s.growth_interval, "the scaler's growth interval")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--optimizer-threads", s.optimizer_threads,
                 "the offload modes' optimizer threads (0: all cores but one)")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--deterministic", s.deterministic,
               "LibTorch's deterministic kernels (the embedding's backward adds in a fixed order):"
               " a mode then repeats its own run bit for bit");
  app.add_option("--mode", s.modes, "modes: gpu, offload, offload-async, offload-overlap")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpu", "offload", "offload-async", "offload-overlap"}));
  CLI11_PARSE(app, argc, argv);
  if (s.shape.embed % 64 != 0) {
    std::cerr << "--embed must be a multiple of 64, got " << s.shape.embed << "\n";
    return 2;
  }
  if (s.warmup >= s.steps) {
    std::cerr << "--warmup must be below --steps\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cout << "no CUDA device, or this LibTorch has no CUDA: nothing to run\n";
    return 0;
  }
  s.shape.heads = s.shape.embed / 64;
  if (s.deterministic) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);  // cuBLAS's condition, read at first use
    at::globalContext().setDeterministicAlgorithms(true, false);
  }
  if (s.optimizer_threads == 0)
    s.optimizer_threads = std::max(1, int(std::thread::hardware_concurrency()) - 1);
  try {
    const GptCorpus corpus(s.text);
    s.shape.vocab = corpus.vocab();
    std::ofstream summary(s.out + "/summary.csv");
    summary << "mode,tokens_per_s,eval_loss,skipped,final_scale\n";
    for (const auto& mode : s.modes) {
      const Summary r = run(mode, corpus, s);
      std::cout << std::left << std::setw(14) << mode << std::fixed << std::setprecision(0)
                << r.tokens_per_s << " tokens/s  eval loss " << std::setprecision(4) << r.eval_loss
                << "  skipped " << r.skipped << "  final scale " << std::defaultfloat
                << r.final_scale << std::endl;
      summary << mode << ',' << std::setprecision(9) << r.tokens_per_s << ',' << r.eval_loss << ','
              << r.skipped << ',' << r.final_scale << '\n';
    }
    if (!summary) throw std::runtime_error("cannot write " + s.out + "/summary.csv");
  } catch (const std::exception& e) {
    std::cerr << "ampactor-bench-gpt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
