// What the metrics cost a training loop, two ways, in one run:
//  1. per iteration, exactly: a keeper core driven alone (no actors, no model) through 20000
//     iterations, with each sink and without; the difference is the CPU time the tap adds to
//     the keeper's thread and the pipeline's reports to the trainer's and optimizer's.
//  2. on a training loop: an MLP stepped by GradScaler + AsyncOptimizer (staleness 0, fused
//     Adam, one thread each), every sink against none, side by side in rotating rounds; the
//     median of per-round ratios.
// The sinks: jsonl, csv, tensorboard, prometheus (those built), and all of them together.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/metrics/metrics.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#ifdef AMPACTOR_TENSORBOARD
#include <ampactor/metrics/tensorboard.h>
#endif
#ifdef AMPACTOR_PROMETHEUS
#include <ampactor/metrics/prometheus.h>
#endif

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <torch/csrc/autograd/autograd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "bench_setup.h"
#include "bench_util.h"

using namespace ampactor;
using namespace ampactor::bench;

namespace {

std::vector<std::string> sinks() {
  std::vector<std::string> s{"jsonl", "csv"};
#ifdef AMPACTOR_TENSORBOARD
  s.push_back("tensorboard");
#endif
#ifdef AMPACTOR_PROMETHEUS
  s.push_back("prometheus");
#endif
  s.push_back("all");
  return s;
}

/// A Metrics with the sink `name` writing under dir (none: nullptr).
std::shared_ptr<Metrics> make_metrics(const std::string& name, const std::string& dir) {
  if (name == "none") return nullptr;
  std::filesystem::create_directories(dir);
  auto m = std::make_shared<Metrics>();
  const bool all = name == "all";
  if (all || name == "jsonl") m->sink(std::make_shared<JsonlMetrics>(dir + "/m.jsonl"));
  if (all || name == "csv") m->sink(std::make_shared<CsvMetrics>(dir + "/m.csv"));
#ifdef AMPACTOR_TENSORBOARD
  if (all || name == "tensorboard") m->sink(std::make_shared<TensorBoardMetrics>(dir + "/tb"));
#endif
#ifdef AMPACTOR_PROMETHEUS
  if (all || name == "prometheus") m->sink(std::make_shared<PrometheusMetrics>("127.0.0.1:0"));
#endif
  return m;
}

/// Part 1: microseconds per iteration of a keeper core with `metrics` as its tap (and the
/// pipeline's two reports), over n iterations.
double core_us(const std::shared_ptr<Metrics>& metrics, int n) {
  // An overflow every 50 iterations, a growth every 10 clean ones: the scale stays in range.
  KeeperCore core(GradScalerOptions().init_scale(1024).growth_interval(10), ScalePolicy::exact,
                  metrics);
  if (metrics) metrics->attached();
  const auto t0 = Clock::now();
  for (iteration_t k = 0; k < n; ++k) {
    core.handle(1, ScaleRequest{k}, 1);
    UnscaleDone d;
    d.k = k;
    d.found_inf = d.local_found_inf = k % 50 == 7;
    d.scale_used = core.state().scale();
    core.handle(2, d);
    if (metrics) {
      metrics->trainer_step(k, 1e-3, 2e-3);
      metrics->optimizer_step(k, 1e-3, 1.5);
    }
    core.handle(1, UpdateScale{k, 1});
  }
  const double us = us_since(t0) / n;
  if (metrics) metrics->close();
  return us;
}

struct Mlp {
  std::vector<at::Tensor> w;
  at::Tensor x, y;
  explicit Mlp(std::int64_t width, std::int64_t batch) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    for (std::int64_t l = 0; l < 4; ++l)
      w.push_back((at::randn({width, width}, gen) / std::sqrt(double(width))).requires_grad_());
    x = at::randn({batch, width}, gen);
    y = at::randn({batch, width}, gen);
  }
  at::Tensor loss() const {
    at::Tensor h = x;
    for (const at::Tensor& l : w)
      h = at::tanh(at::matmul(h, l));
    return at::mean((h - y) * (h - y));
  }
};

/// Part 2: ms per iteration of `iters` training iterations (after 3 untimed) with `metrics`.
double loop_ms(const std::shared_ptr<Metrics>& metrics, std::int64_t width, std::int64_t batch,
               int iters) {
  Mlp m(width, batch);
  double ms = 0;
  {
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(1000),
                      KeeperOptions().tap(metrics));
    AsyncOptimizer pipe(m.w, scaler,
                        AsyncOptimizerOptions().staleness(0).optimizer_threads(1).tap(metrics));
    auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-4),
                                                      optim::FusedOptions().threads(1));
    Clock::time_point t0;
    for (int i = 0; i < iters + 3; ++i) {
      if (i == 3) t0 = Clock::now();
      torch::autograd::backward({scaler.scale(m.loss())});
      pipe.step(opt, [&] { scaler.step(opt); });
      scaler.update();
      for (at::Tensor& w : m.w)
        w.mutable_grad() = at::Tensor();  // the model's zero_grad()
    }
    pipe.sync();
    ms = ms_since(t0) / iters;
  }
  return ms;
}

using Series = std::map<std::string, std::vector<double>>;

/// Part 1, alternating with the bare core five times.
Series measure_core(const std::vector<std::string>& names, const std::string& dir, int n) {
  Series core;
  for (int r = 0; r < 5; ++r) {
    core["none"].push_back(core_us(nullptr, n));
    for (const std::string& s : names)
      core[s].push_back(core_us(make_metrics(s, dir + "/core-" + s), n));
  }
  return core;
}

struct Loop {
  Series ms, ratio;  // per mode: each round's ms an iteration; per sink: its ratio to none
};

/// Part 2: every mode once a round, the order rotating.
Loop measure_loop(const std::vector<std::string>& names, const std::string& dir, int rounds,
                  std::int64_t width, std::int64_t batch, int iters) {
  std::vector<std::string> modes{"none"};
  modes.insert(modes.end(), names.begin(), names.end());
  Loop l;
  for (int r = 0; r < rounds; ++r) {
    std::map<std::string, double> round;
    for (std::size_t i = 0; i < modes.size(); ++i) {
      const std::string& mode = modes[(i + r) % modes.size()];
      const std::string d = dir + "/loop-" + mode + "-" + std::to_string(r);
      round[mode] = loop_ms(make_metrics(mode, d), width, batch, iters);
      l.ms[mode].push_back(round[mode]);
    }
    for (const std::string& s : names)
      l.ratio[s].push_back(round[s] / round["none"]);
    std::cerr << "round " << r + 1 << "/" << rounds << "\n";
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-metrics: what the metrics sinks cost a training loop"};
  int rounds = 10, iters = 200, core_iters = 20000;
  std::int64_t width = 512, batch = 128;  // the demo's hidden layers and batch
  std::string json, dir = "/tmp/ampactor-bench-metrics";
  app.add_option("--rounds", rounds, "training-loop rounds (each runs every mode)");
  app.add_option("--iterations", iters, "timed iterations per mode and round");
  app.add_option("--core-iterations", core_iters, "iterations of the keeper-core measurement");
  app.add_option("--width", width, "the MLP's width (4 layers)");
  app.add_option("--batch", batch, "the MLP's batch");
  app.add_option("--dir", dir, "where the sinks write (emptied)");
  app.add_option("--json", json, "write the results here");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<std::string> names = sinks();

  Series core = measure_core(names, dir, core_iters);
  Loop loop = measure_loop(names, dir, rounds, width, batch, iters);
  Series &ms = loop.ms, &ratio = loop.ratio;
  const double base_us = median_of(core["none"]);
  const double iteration_ms = median_of(ms["none"]);
  nlohmann::json out = {{"bench", "metrics"},
                        {"command", "ampactor-bench-metrics --rounds " + std::to_string(rounds) +
                                        " --iterations " + std::to_string(iters)},
                        {"width", width},
                        {"batch", batch},
                        {"iteration_ms", iteration_ms},
                        {"core_us_bare", base_us},
                        {"sinks", nlohmann::json::object()}};
  std::cout << std::fixed << std::setprecision(2) << "iteration " << iteration_ms << " ms (MLP 4x"
            << width << ", batch " << batch << "); bare keeper core " << base_us
            << " us/iteration\n"
            << "| sink | added us / iteration (keeper core) | share of the iteration | loop "
               "ratio (median of "
            << rounds << ") |\n|---|---|---|---|\n";
  for (const std::string& s : names) {
    const double added = median_of(core[s]) - base_us;
    const double share = added / (iteration_ms * 1e3);
    const double r = median_of(ratio[s]);
    std::cout << "| " << s << " | " << std::setprecision(2) << added << " | "
              << std::setprecision(3) << share * 100 << "% | " << r << " |\n";
    out["sinks"][s] = {{"added_us", added},
                       {"share", share},
                       {"loop_ratio", r},
                       {"loop_ms", ms[s]},
                       {"core_us", core[s]}};
  }
  out["loop_ms_none"] = ms["none"];
  out["setup"] = run_setup();
  if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
  std::filesystem::remove_all(dir);
  return 0;
}
