// ampactor-demo: fp16 mixed-precision training of a character-level language model, side by side:
// fp32, fp16 without loss scaling, and fp16 with ampactor (synchronous; asynchronous under the
// exact and the lagged policy; RoundPipe's rule; DeepSpeed's rule), through a burst of organic
// overflows. Writes CSVs per run, a summary, and a PNG plot.
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>

#include "demo.h"

using demo::kModes;
using demo::Settings;
using demo::Summary;

namespace {

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--steps", s.steps, "iterations per run")->check(CLI::Range(1, 1000000));
  app.add_option("--batch", s.batch, "characters predicted per iteration")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--hidden", s.hidden, "the hidden layers' width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers", s.layers, "hidden layers (Linear, tanh)")->check(CLI::Range(1, 64));
  app.add_option("--lr", s.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "seed for the weights and the batches");
  app.add_option("--optimizer", s.optimizer,
                 "the asynchronous runs' Adam: fused (ampactor::optim::FusedAdam: reads the fp16 "
                 "grads, unscales, skips and writes the weights in one pass) or torch "
                 "(torch::optim::Adam after the grad move); the same numbers either way")
      ->check(CLI::IsMember({"fused", "torch"}));
  app.add_option("--behind-ms", s.behind_ms,
                 "fp16-async-lagged-behind: ms each optimizer job waits before it starts (an "
                 "optimizer slower than forward + backward)")
      ->check(CLI::Range(0, 60000));
  app.add_option("--overflow-at", s.overflow_at,
                 "iterations whose loss is scaled up 1e5x to force an overflow (scaled modes; "
                 "default: none)")
      ->delimiter(',');
  app.add_option("--spike-at", s.spike_at,
                 "first iteration of the burst (default: 60% of the steps)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--spike-length", s.spike_length,
                 "iterations of the burst, which draw --spike-factor times the batch with the "
                 "usual normalisation, so the gradients grow that much (0: no burst)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--spike-factor", s.spike_factor, "the burst's batch multiple")
      ->check(CLI::Range(1, 1024));
  app.add_option("--workers", s.workers,
                 "the loss is normalised by the characters of this many data-parallel workers "
                 "(sum over this batch / (workers x batch)), as in data-parallel training; 1: the "
                 "plain mean")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--growth-interval", s.growth_interval, "the scaler's growth interval")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--probe-every", s.probe_every,
                 "measure fp16 gradient underflow every N iterations (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", s.threads,
                 "the trainer's LibTorch threads (0: all cores; the optimizer runs on a thread of "
                 "its own)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--out", s.out, "output folder");
  app.add_option("--text-dir", s.text_dir, "folder of text files to train on");
  app.add_option("--trace", s.trace,
                 "record every scale_keeper message of each scaled run to this JSON Lines file "
                 "(one file per run: the mode goes before the extension); replay with "
                 "ampactor-replay");
  app.add_option("--device", s.device,
                 "cpu: fp16 emulated by rounding through Half; cuda: real fp16 on the GPU "
                 "(a LibTorch built with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
#ifdef AMPACTOR_DEMO_DIST  // the build has ampactor::dist
  app.add_option("--nproc", s.nproc,
                 "then the same runs over N data-parallel ranks on this machine (ampactor-launch, "
                 "c10d's gloo), beside the single-process ones (default modes: fp16-sync, "
                 "fp16-async)")
      ->check(CLI::Range(2, 64));
#endif
  app.add_option("--mode", s.modes, "runs, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(kModes));
}

/// The settings that cannot be checked one by one; a message and 2 when they do not fit.
int check_settings(const CLI::App& app, Settings& s) {
  if (s.spike_at < 0) s.spike_at = s.steps * 3 / 5;
  // The default burst shortens to fit a short run; one asked for must fit.
  if (app.count("--spike-at") + app.count("--spike-length") == 0)
    s.spike_length = std::min(s.spike_length, s.steps - s.spike_at);
  if (s.spike_length > 0 && s.spike_at + s.spike_length > s.steps) {
    std::cerr << "--spike-at/--spike-length: the burst " << s.spike_at << ".."
              << s.spike_at + s.spike_length - 1 << " is outside 0.." << s.steps - 1 << "\n";
    return 2;
  }
  for (int k : s.overflow_at)
    if (k < 0 || k >= s.steps) {
      std::cerr << "--overflow-at: iteration " << k << " is outside 0.." << s.steps - 1 << "\n";
      return 2;
    }
  if (s.nproc > 1) {
    if (app.count("--mode") == 0) s.modes = {"fp16-sync", "fp16-async"};
    for (const auto& m : s.modes)
      if (!demo::scaled(m)) {
        std::cerr << "--nproc: mode " << m
                  << " has no scaler, so nothing averages its ranks' gradients\n";
        return 2;
      }
  }
  // fp16-overlap runs with the model on the CPU and without ranks (for now).
  const bool overlap_asked = std::count(s.modes.begin(), s.modes.end(), "fp16-overlap") > 0;
  if (overlap_asked && (s.device == "cuda" || s.nproc > 1)) {
    if (app.count("--mode")) {
      std::cerr << "--mode fp16-overlap: runs with the model on the CPU and without --nproc "
                   "only, for now\n";
      return 2;
    }
    s.modes.erase(std::find(s.modes.begin(), s.modes.end(), "fp16-overlap"));
    std::cout << "fp16-overlap left out: it runs with the model on the CPU and without --nproc "
                 "only, for now\n";
  }
  if (s.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr
        << "--device cuda: this LibTorch has no CUDA, or no GPU is visible (Debian's "
           "LibTorch is CPU-only: build against a CUDA LibTorch, see doc/build/gpu-hosts.md)\n";
    return 2;
  }
  return 0;
}

/// One rank of --nproc: the runs, no report (the launching process makes it).
int run_rank(Settings& s) {
  demo::Corpus corpus(s.text_dir);
  const demo::ModelShape shape = s.shape(corpus.vocab());
  for (const auto& mode : s.modes) {
    if (s.rank == 0) std::cout << "run " << mode << " (rank 0 of " << s.world << ")\n";
    demo::run(mode, corpus, shape, s);
  }
  return 0;
}

/// Every mode in this process, the report and the plot, then the data-parallel runs if asked.
int run_all(Settings& s, int argc, char** argv) {
  demo::Corpus corpus(s.text_dir);
  const demo::ModelShape shape = s.shape(corpus.vocab());
  std::cout << "corpus: " << corpus.files() << " files from " << s.text_dir << ", " << corpus.size()
            << " characters, alphabet " << corpus.vocab() << "\n"
            << "model: context " << shape.context << ", embedding " << shape.embed << ", "
            << shape.layers << " hidden layers of " << shape.hidden << "; batch " << s.batch << ", "
            << s.steps << " steps, Adam lr " << s.lr << " (asynchronous runs: " << s.optimizer
            << "), " << at::get_num_threads() << " threads, device " << s.device
            << (s.device == "cuda" ? " (real fp16)" : " (fp16 emulated)") << "\n";
  std::vector<Summary> runs;
  for (const auto& mode : s.modes) {
    std::cout << "run " << mode << "\n";
    runs.push_back(demo::run(mode, corpus, shape, s));
    if (const std::string t = demo::trace_file(s, mode); !t.empty())
      std::cout << "  trace: " << t << " (check it: ampactor-replay " << t << ")\n";
  }
  demo::report(s, runs);
  demo::plot(s, runs);
  if (const auto c = demo::pipeline_case(s, runs); c && !c->equal) {
    std::cerr << "ampactor-demo: fp16-overlap differs from fp16-sync in " << c->differs << "\n";
    return 1;
  }
  if (s.nproc > 1) {
    if (demo::launch_ranks(s, argc, argv) != 0) {
      std::cerr << "ampactor-demo: the data-parallel ranks failed (above)\n";
      return 1;
    }
    demo::compare_data_parallel(s, runs);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"ampactor-demo: fp16 training with and without loss scaling, side by side"};
  add_options(app, s);
  CLI11_PARSE(app, argc, argv);
  if (const int rc = check_settings(app, s)) return rc;
  try {
    const bool rank = s.nproc > 1 && demo::is_rank();
    if (rank) demo::become_rank(s);
    std::filesystem::create_directories(s.out);
    demo::flush_denormals();
    const int threads =
        s.threads > 0 ? s.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(rank ? std::max(1, threads / s.nproc) : threads);
    return rank ? run_rank(s) : run_all(s, argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ampactor-demo: " << e.what() << "\n";
    return 1;
  }
}
