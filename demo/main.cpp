// ampactor-demo: fp16 mixed-precision training of a character-level language model, side by side:
// fp32, fp16 without loss scaling, and fp16 with ampactor (synchronous, asynchronous exact,
// asynchronous lagged). Writes a CSV per run, a summary, and a PNG plot.
#include <ampactor/async_optimizer.h>
#include <ampactor/grad_scaler.h>
#include <ampactor/trace/trace.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "charlm.h"

namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kModes = {"fp32", "fp16-noscale", "fp16-sync", "fp16-async",
                                         "fp16-async-lagged"};

struct Settings {
  int steps = 300;
  std::int64_t batch = 4096;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::vector<int> overflow_at;  // default: the middle iteration
  int growth_interval = 100;
  double workers = 64;
  int probe_every = 25;
  int threads = 0;
  std::string out = "out/demo";
  std::string text_dir = "/usr/share/common-licenses";
  std::string device = "cpu";
  std::string trace;  // record each scaled run's keeper messages (JSON Lines)
  std::vector<std::string> modes = kModes;
};

struct Summary {
  std::string mode;
  double train_loss = 0;  // mean over the last 20 iterations
  double eval_loss = 0;   // held-out text, fp32 math on the final weights
  int skipped = 0;
  int backoffs = 0;
  double final_scale = 0;
  double underflow = -1;      // share of fp32-non-zero weight-gradient elements that fp16 zeroed
  double act_underflow = -1;  // the same at the fp16 activation boundaries of backward
  double wall_s = 0;
};

struct Row {
  int k;
  double loss, scale;
  bool skipped;
  double ms;
};

/// Adam's second moments of gradients this small reach fp32's denormal range, where x86
/// arithmetic is 5-10x slower. Flushing them changes nothing fp16 could represent (its smallest
/// value is 6e-8). The mode is per thread: this thread and its OpenMP team.
void flush_denormals() {
  at::globalContext().setFlushDenormal(true);
#pragma omp parallel num_threads(at::get_num_threads())
  { at::globalContext().setFlushDenormal(true); }
}

double eval_loss(const std::vector<at::Tensor>& weights, const demo::ModelShape& shape,
                 const demo::Corpus& corpus, const Settings& s) {
  at::AutoGradMode no_grad(false);
  std::mt19937_64 rng(s.seed + 999);
  std::vector<at::Tensor> w;
  for (const auto& t : weights)
    w.push_back(t.detach().to(at::kFloat));
  double sum = 0;
  const int batches = 8;
  for (int i = 0; i < batches; ++i) {
    auto [x, y] = corpus.batch(rng, s.batch, shape.context, true);
    sum += demo::CharMlp::loss_fp32(w, x.to(w[0].device()), y.to(w[0].device())).item<double>();
  }
  return sum / batches;
}

/// fp32 gradients of the same batch with the model's current weights, for the underflow probe.
std::vector<at::Tensor> fp32_grads(const std::vector<at::Tensor>& weights, const at::Tensor& x,
                                   const at::Tensor& y) {
  std::vector<at::Tensor> w;
  for (const auto& t : weights)
    w.push_back(t.detach().to(at::kFloat).set_requires_grad(true));
  demo::CharMlp::loss_fp32(w, x, y).backward();
  std::vector<at::Tensor> g;
  for (auto& t : w)
    g.push_back(t.grad());
  return g;
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  f << "iteration,loss,scale,skipped,ms\n";
  for (const Row& r : rows)
    f << r.k << ',' << std::setprecision(9) << r.loss << ',' << r.scale << ',' << int(r.skipped)
      << ',' << std::setprecision(4) << r.ms << '\n';
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// --trace FILE: one trace per scaled run, FILE itself when only one runs, else FILE with the mode
/// before the extension (run.jsonl -> run.fp16-sync.jsonl). Empty: not recording.
std::string trace_file(const Settings& s, const std::string& mode) {
  if (s.trace.empty() || mode == "fp32" || mode == "fp16-noscale") return {};
  int scaled = 0;
  for (const auto& m : s.modes)
    scaled += m != "fp32" && m != "fp16-noscale";
  if (scaled == 1) return s.trace;
  const std::filesystem::path p(s.trace);
  return (p.parent_path() / (p.stem().string() + "." + mode + p.extension().string())).string();
}

Summary run(const std::string& mode, const demo::Corpus& corpus, const demo::ModelShape& shape,
            const Settings& s) {
  const bool fp32 = mode == "fp32";
  const bool scaled = mode != "fp32" && mode != "fp16-noscale";
  const bool async = mode == "fp16-async" || mode == "fp16-async-lagged";
  const at::Device device(s.device);
  demo::CharMlp model(shape, fp32 ? at::kFloat : at::kHalf, s.seed, device);
  std::mt19937_64 rng(s.seed);
  std::set<int> inject;
  if (scaled) inject.insert(s.overflow_at.begin(), s.overflow_at.end());

  const auto so = ampactor::GradScalerOptions()
                      .init_scale(65536)
                      .growth_interval(s.growth_interval)
                      .enabled(scaled)
                      .allow_fp16_grads(true);
  const auto policy =
      mode == "fp16-async-lagged" ? ampactor::ScalePolicy::lagged : ampactor::ScalePolicy::exact;
  std::unique_ptr<ampactor::GradScaler> scaler;
  std::unique_ptr<ampactor::AsyncOptimizer> pipe;
  std::unique_ptr<torch::optim::Adam> opt;
  if (fp32) {
    opt = std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(s.lr));
  } else {
    const std::string trace = trace_file(s, mode);
    scaler = std::make_unique<ampactor::GradScaler>(
        so, policy, trace.empty() ? nullptr : ampactor::record_trace(trace));
    scaler->run_on_optimizer(flush_denormals);  // the optimizer thread has a team of its own
    // Asynchronous runs take everything but the weight swap off the trainer's path (the same
    // numbers as without; README "The asynchronous pipeline").
    pipe = std::make_unique<ampactor::AsyncOptimizer>(model.parameters(), *scaler,
                                                      ampactor::AsyncOptimizerOptions()
                                                          .staleness(async ? 1 : 0)
                                                          .optimizer_threads(1)
                                                          .swap_weights(async)
                                                          .defer_grad_move(async));
    opt = std::make_unique<torch::optim::Adam>(pipe->optim_parameters(),
                                               torch::optim::AdamOptions(s.lr));
  }

  std::vector<Row> rows;
  double underflow_sum = 0, act_nonzero = 0, act_lost = 0;
  int probes = 0;
  const auto t0 = Clock::now();
  const int report = std::max(1, s.steps / 10);
  for (int k = 0; k < s.steps; ++k) {
    const auto it0 = Clock::now();
    auto [xc, yc] = corpus.batch(rng, s.batch, shape.context, false);
    const at::Tensor x = xc.to(device), y = yc.to(device);
    model.zero_grad();
    at::Tensor loss = model.loss(x, y);
    const double loss_v = loss.item<double>();
    double scale = 1;
    if (fp32) {
      (loss / s.workers).backward();
      opt->step();
    } else {
      // A scaled-up batch at the chosen iterations: an overflow.
      at::Tensor l = loss / s.workers * (inject.count(k) ? 1e5 * s.workers : 1.0);
      const bool probe_now = s.probe_every > 0 && k % s.probe_every == 0 && !inject.count(k);
      {
        std::optional<demo::BoundaryProbe> probe;
        if (probe_now) probe.emplace();
        scaler->scale(l).backward();
        if (probe) act_nonzero += probe->nonzero(), act_lost += probe->lost();
      }
      scale = scaler->get_scale();
      if (probe_now) {
        std::vector<at::Tensor> g;
        for (auto& p : model.parameters())
          g.push_back(p.grad());
        underflow_sum += demo::underflow_fraction(g, fp32_grads(model.parameters(), x, y));
        ++probes;
      }
      pipe->step(*opt, [&] { scaler->step(*opt); });
      scaler->update();
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - it0).count();
    rows.push_back({k, loss_v, scale, false, ms});
    if ((k + 1) % report == 0 || k + 1 == s.steps)
      std::cout << "  [" << mode << "] " << std::setw(4) << k + 1 << "/" << s.steps << "  loss "
                << std::fixed << std::setprecision(3) << loss_v << "  scale " << std::defaultfloat
                << scale << std::endl;
  }
  Summary sum;
  sum.mode = mode;
  if (pipe) {
    pipe->sync();
    scaler->sync();
    for (int k = 0; k < s.steps; ++k)
      rows[std::size_t(k)].skipped = scaler->wait_result(k).skipped();
    sum.final_scale = scaler->get_scale();
  }
  sum.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const Row& r : rows)
    sum.skipped += r.skipped;
  for (std::size_t k = 1; k < rows.size(); ++k)
    sum.backoffs += rows[k].scale < rows[k - 1].scale;
  if (!rows.empty() && sum.final_scale > 0 && sum.final_scale < rows.back().scale) ++sum.backoffs;
  const std::size_t tail = std::min<std::size_t>(20, rows.size());
  for (std::size_t i = rows.size() - tail; i < rows.size(); ++i)
    sum.train_loss += rows[i].loss / double(tail);
  sum.eval_loss = eval_loss(pipe ? pipe->optim_parameters() : model.parameters(), shape, corpus, s);
  sum.underflow = probes ? underflow_sum / probes : -1;
  sum.act_underflow = act_nonzero > 0 ? act_lost / act_nonzero : -1;
  write_csv(s.out + "/" + mode + ".csv", rows);
  return sum;
}

void plot(const Settings& s, const std::vector<Summary>& runs) {
  const std::string gp = s.out + "/demo.gp";
  std::ofstream f(gp);
  f << "set terminal pngcairo size 1200,900\nset output '" << s.out << "/demo.png'\n"
    << "set datafile separator ','\nset multiplot layout 2,1\n"
    << "set title 'Training loss (character-level LM, "
    << (s.device == "cuda" ? "real fp16 on the GPU" : "fp16 emulated on the CPU") << ")'\n"
    << "set xlabel 'iteration'\nset ylabel 'loss'\nset key top right\n"
    << "plot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    f << (i ? ", " : "") << "'" << s.out << "/" << runs[i].mode
      << ".csv' using 1:2 every ::1 with lines title '" << runs[i].mode << "'";
  f << "\nset title 'Loss scale (skipped steps marked)'\nset ylabel 'scale'\nset logscale y 2\n"
    << "set offsets graph 0, graph 0, graph 0.15, graph 0.15\n"
    << "plot ";
  bool first = true;
  for (const auto& r : runs) {
    if (r.mode == "fp32" || r.mode == "fp16-noscale") continue;
    const std::string csv = s.out + "/" + r.mode + ".csv";
    f << (first ? "" : ", ") << "'" << csv << "' using 1:3 every ::1 with steps title '" << r.mode
      << "', '" << csv << "' using 1:($4 > 0 ? $3 : 1/0) every ::1 with points pt 7 title '"
      << r.mode << " skipped'";
    first = false;
  }
  f << "\nunset multiplot\n";
  f.close();
  if (first) return;
  const std::string cmd = "gnuplot '" + gp + "' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    std::cout << "gnuplot failed or is missing (apt-get install gnuplot-nox); the CSVs and " << gp
              << " are there to plot by hand\n";
  else
    std::cout << "plot: " << s.out << "/demo.png\n";
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"ampactor-demo: fp16 training with and without loss scaling, side by side"};
  app.add_option("--steps", s.steps, "iterations per run")->check(CLI::Range(1, 1000000));
  app.add_option("--batch", s.batch, "characters predicted per iteration")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", s.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "seed for the weights and the batches");
  app.add_option(
         "--overflow-at", s.overflow_at,
         "iterations whose loss is scaled up 1e5x to force an overflow (scaled modes; default: "
         "the middle one)")
      ->delimiter(',');
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
  app.add_option("--threads", s.threads, "LibTorch threads (0: all cores)")
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
  app.add_option("--mode", s.modes, "runs, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(kModes));
  CLI11_PARSE(app, argc, argv);
  if (app.count("--overflow-at") == 0) s.overflow_at = {s.steps / 2};
  for (int k : s.overflow_at)
    if (k < 0 || k >= s.steps) {
      std::cerr << "--overflow-at: iteration " << k << " is outside 0.." << s.steps - 1 << "\n";
      return 2;
    }
  if (s.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "--device cuda: this LibTorch has no CUDA, or no GPU is visible (Debian's "
                 "LibTorch is CPU-only: build against a CUDA LibTorch, see the README)\n";
    return 2;
  }
  try {
    std::filesystem::create_directories(s.out);
    flush_denormals();
    at::set_num_threads(s.threads > 0 ? s.threads
                                      : int(std::max(1u, std::thread::hardware_concurrency())));
    demo::Corpus corpus(s.text_dir);
    demo::ModelShape shape;
    shape.vocab = corpus.vocab();
    std::cout << "corpus: " << corpus.files() << " files from " << s.text_dir << ", "
              << corpus.size() << " characters, alphabet " << corpus.vocab() << "\n"
              << "model: context " << shape.context << ", embedding " << shape.embed << ", hidden "
              << shape.hidden << "; batch " << s.batch << ", " << s.steps << " steps, Adam lr "
              << s.lr << ", " << at::get_num_threads() << " threads, device " << s.device
              << (s.device == "cuda" ? " (real fp16)" : " (fp16 emulated)") << "\n";
    std::vector<Summary> runs;
    for (const auto& mode : s.modes) {
      std::cout << "run " << mode << "\n";
      runs.push_back(run(mode, corpus, shape, s));
      if (const std::string t = trace_file(s, mode); !t.empty())
        std::cout << "  trace: " << t << " (check it: ampactor-replay " << t << ")\n";
    }
    std::ofstream sum(s.out + "/summary.csv");
    sum << "mode,train_loss,eval_loss,skipped,backoffs,final_scale,weight_grad_underflow,"
           "activation_grad_underflow,wall_s,it_per_s\n";
    auto pct = [](double v) {
      std::ostringstream o;
      if (v >= 0)
        o << std::fixed << std::setprecision(2) << 100 * v << "%";
      else
        o << "-";
      return o.str();
    };
    std::cout << "\n"
              << std::left << std::setw(19) << "mode" << std::right << std::setw(11) << "train loss"
              << std::setw(10) << "eval loss" << std::setw(9) << "skipped" << std::setw(10)
              << "backoffs" << std::setw(13) << "final scale" << std::setw(10) << "w-grad uf"
              << std::setw(10) << "act uf" << std::setw(9) << "wall s" << std::setw(8) << "it/s"
              << "\n";
    for (const auto& r : runs) {
      const double ips = s.steps / r.wall_s;
      std::cout << std::left << std::setw(19) << r.mode << std::right << std::fixed
                << std::setprecision(4) << std::setw(11) << r.train_loss << std::setw(10)
                << r.eval_loss << std::setw(9) << r.skipped << std::setw(10) << r.backoffs
                << std::setw(13) << std::defaultfloat << (r.final_scale > 0 ? r.final_scale : 1)
                << std::setw(10) << pct(r.underflow) << std::setw(10) << pct(r.act_underflow)
                << std::fixed << std::setprecision(1) << std::setw(9) << r.wall_s << std::setw(8)
                << ips << "\n";
      sum << r.mode << ',' << r.train_loss << ',' << r.eval_loss << ',' << r.skipped << ','
          << r.backoffs << ',' << r.final_scale << ',' << r.underflow << ',' << r.act_underflow
          << ',' << r.wall_s << ',' << ips << '\n';
    }
    std::cout << "\nw-grad uf: share of weight-gradient elements that are non-zero in fp32 math "
                 "but zero in the fp16 model's gradients\n"
                 "act uf:    share of activation-gradient elements that are non-zero before and "
                 "zero after rounding to fp16 at the layer boundaries of backward\n"
                 "(both measured every "
              << s.probe_every << " iterations)\n"
              << "CSVs and summary: " << s.out << "/\n";
    plot(s, runs);
  } catch (const std::exception& e) {
    std::cerr << "ampactor-demo: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
