// ampactor-bench-shard: the sharded optimizer state (AsyncOptimizerOptions::shard_optimizer_state)
// against the unsharded data-parallel pipeline, on loopback (gloo), 1 LibTorch thread per rank.
// Run without RANK in the environment it launches itself with ampactor-launch, once per rank
// count and mode, and prints per rank (the largest over the ranks): the optimizer's state
// (masters and FusedAdam's moments, as allocated tensors), the process's RSS growth over the
// run, and the optimizer side of an iteration at staleness 0 (all of step(), which the trainer
// waits for), with the collectives' time (the gradient average, the weights' all-gather) apart
// and the rest of it (each iteration's step minus its collectives: the grad move, the step, the
// weights' copies). Medians over the iterations after the first 3. Each rank count runs the two
// modes --repeat times in turn, each pair side by side in time; the ratios are each pair's, and
// the figures kept are those of the pair whose ratio without the collectives is the median.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/distributed/dist.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "bench_setup.h"
#include "bench_util.h"
#include "timed_ranks.h"

using namespace ampactor;
using bench::Clock;
using bench::TimedRanks;

namespace {

/// VmRSS in MiB.
double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

std::int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * std::int64_t(t.element_size()) : 0;
}

nlohmann::json run(bool shard, std::int64_t width, int layers, int steps) {
  const dist::World w = dist::init_from_env();
  auto timed = std::make_shared<TimedRanks>(w.ranks);
  torch::manual_seed(1);
  torch::nn::Sequential net;
  for (int l = 0; l < layers; ++l)
    net->push_back(torch::nn::Linear(width, width));
  const at::Tensor x = at::randn({64, width});
  const double rss0 = rss_mib();
  GradScaler scaler(GradScalerOptions().ranks(timed));
  AsyncOptimizer pipe(
      net->parameters(), scaler,
      AsyncOptimizerOptions().staleness(0).optimizer_threads(1).shard_optimizer_state(shard));
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-4));
  std::vector<double> step_ms, avg_ms, gather_ms, compute_ms;
  for (int k = 0; k < steps; ++k) {
    net->zero_grad();
    scaler.scale(net->forward(x).pow(2).mean()).backward();
    const std::size_t a0 = timed->average_ms.size(), g0 = timed->gather_ms.size();
    const auto t0 = Clock::now();
    pipe.step(opt, [&] { scaler.step(opt); });
    const double ms = bench::ms_since(t0);
    scaler.update();
    if (k >= 3) {
      step_ms.push_back(ms);
      avg_ms.push_back(bench::sum_from(timed->average_ms, a0));
      gather_ms.push_back(bench::sum_from(timed->gather_ms, g0));
      compute_ms.push_back(ms - avg_ms.back() - gather_ms.back());
    }
  }
  pipe.sync();
  std::int64_t state = 0;
  for (const at::Tensor& m : pipe.optim_parameters())
    state += bytes_of(m);
  for (const auto& [key, s] : opt.state()) {
    const auto& a = static_cast<const torch::optim::AdamParamState&>(*s);
    state += bytes_of(a.exp_avg()) + bytes_of(a.exp_avg_sq()) + bytes_of(a.max_exp_avg_sq());
  }
  std::int64_t params = 0;
  for (const at::Tensor& p : net->parameters())
    params += p.numel();
  return {{"rank", w.launch.rank},
          {"params", params},
          {"state_bytes", state},
          {"rss_growth_mib", rss_mib() - rss0},
          {"step_ms", bench::median_of(step_ms)},
          {"average_ms", bench::median_of(avg_ms)},
          {"gather_ms", bench::median_of(gather_ms)},
          {"compute_ms", bench::median_of(compute_ms)}};
}

/// The largest of each figure over the ranks' parts.
nlohmann::json largest(const std::vector<nlohmann::json>& parts) {
  nlohmann::json out = parts.at(0);
  for (const auto& p : parts)
    for (auto it = p.begin(); it != p.end(); ++it)
      if (it->is_number() && it.key() != "rank")
        out[it.key()] = std::max(out[it.key()].get<double>(), it->get<double>());
  return out;
}

/// One run of each mode on n ranks, in turn; prints both rows and returns the pair's figures.
nlohmann::json run_pair(const char* self, int n, std::int64_t width, int layers, int steps) {
  nlohmann::json pair;
  for (const char* m : {"unsharded", "sharded"}) {
    const std::string p = "/tmp/ampactor-bench-shard-" + std::to_string(::getpid());
    std::ostringstream cmd;
    cmd << AMPACTOR_LAUNCH << " --nproc " << n << " --master-port 0 -- " << self << " --mode " << m
        << " --width " << width << " --layers " << layers << " --steps " << steps << " --part "
        << p;
    if (std::system(cmd.str().c_str()) != 0)
      throw std::runtime_error("the " + std::string(m) + " run of " + std::to_string(n) +
                               " ranks failed");
    std::vector<nlohmann::json> parts;
    for (int r = 0; r < n; ++r) {
      nlohmann::json j;
      std::ifstream(p + "." + std::to_string(r)) >> j;
      std::remove((p + "." + std::to_string(r)).c_str());
      parts.push_back(j);
    }
    const nlohmann::json j = largest(parts);
    pair[m] = j;
    const double mib = 1024.0 * 1024.0;
    std::cout << std::fixed << std::left << std::setw(7) << n << std::setw(11) << m << std::right
              << std::setprecision(1) << std::setw(11) << j["state_bytes"].get<double>() / mib
              << std::setw(11) << j["rss_growth_mib"].get<double>() << std::setprecision(2)
              << std::setw(10) << j["step_ms"].get<double>() << std::setw(12)
              << j["average_ms"].get<double>() << std::setw(11) << j["gather_ms"].get<double>()
              << std::setw(16) << j["compute_ms"].get<double>() << "\n";
  }
  const auto& u = pair["unsharded"];
  const auto& s = pair["sharded"];
  pair["ranks"] = n;
  pair["state_ratio"] = s["state_bytes"].get<double>() / u["state_bytes"].get<double>();
  pair["state_ratio_times_ranks"] = pair["state_ratio"].get<double>() * n;  // 1: exactly 1/N
  pair["step_ratio"] = s["step_ms"].get<double>() / u["step_ms"].get<double>();
  pair["step_ratio_without_collectives"] =
      s["compute_ms"].get<double>() / u["compute_ms"].get<double>();
  std::cout << std::setprecision(3) << "  sharded / unsharded: state "
            << pair["state_ratio"].get<double>() << "x (1/N = " << 1.0 / n << "), optimizer side "
            << pair["step_ratio"].get<double>() << "x, without the collectives "
            << pair["step_ratio_without_collectives"].get<double>() << "x\n";
  return pair;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-shard: the sharded optimizer state against the unsharded one"};
  std::vector<int> nprocs{1, 2, 4};
  int steps = 40, layers = 4, repeat = 3;
  std::int64_t width = 1024;
  std::string json, part, mode;
  app.add_option("--nproc", nprocs, "rank counts, each two runs of their own")
      ->check(CLI::Range(1, 64));
  app.add_option("--width", width, "the model's width (square linear layers)")
      ->check(CLI::Range(8, 16384));
  app.add_option("--layers", layers, "the model's layers")->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "iterations per run")->check(CLI::Range(5, 100000));
  app.add_option("--repeat", repeat, "pairs of runs per rank count (the median pair is kept)")
      ->check(CLI::Range(1, 100));
  app.add_option("--json", json, "write the figures as JSON to this file");
  app.add_option("--part", part, "(internal) this rank's output file");
  app.add_option("--mode", mode, "(internal) sharded or unsharded");
  CLI11_PARSE(app, argc, argv);
  try {
    if (std::getenv("RANK")) {
      at::set_num_threads(1);
      const nlohmann::json j = run(mode == "sharded", width, layers, steps);
      std::ofstream(part + "." + std::getenv("RANK")) << j.dump();
      return 0;
    }
    std::cout << "ampactor-bench-shard: gloo on loopback, 1 LibTorch thread per rank, FusedAdam, "
              << layers << " x " << width << "^2 linear layers, staleness 0; per rank, the "
              << "largest over the ranks\n\n"
              << std::left << std::setw(7) << "ranks" << std::setw(11) << "mode" << std::right
              << std::setw(11) << "state MiB" << std::setw(11) << "RSS MiB" << std::setw(10)
              << "step ms" << std::setw(12) << "average ms" << std::setw(11) << "gather ms"
              << std::setw(16) << "step - coll. ms"
              << "\n";
    nlohmann::json all = nlohmann::json::array();
    for (int n : nprocs) {
      std::vector<nlohmann::json> pairs;
      for (int rep = 0; rep < repeat; ++rep)
        pairs.push_back(run_pair(argv[0], n, width, layers, steps));
      std::vector<double> ratios;
      for (const auto& p : pairs)
        ratios.push_back(p["step_ratio_without_collectives"].get<double>());
      std::vector<std::size_t> order(pairs.size());
      for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](std::size_t a, std::size_t b) { return ratios[a] < ratios[b]; });
      nlohmann::json kept = pairs[order[order.size() / 2]];
      kept["step_ratio_without_collectives_runs"] = ratios;
      std::cout << std::setprecision(3) << "  " << n
                << " ranks, without the collectives, each pair:";
      for (double r : ratios)
        std::cout << " " << r << "x";
      std::cout << "; the median pair: " << kept["step_ratio_without_collectives"].get<double>()
                << "x\n";
      kept["setup"] = ampactor::bench::run_setup();
      all.push_back(kept);
    }
    if (!json.empty()) std::ofstream(json) << all.dump(2);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ampactor-bench-shard: " << e.what() << "\n";
    return 1;
  }
}
