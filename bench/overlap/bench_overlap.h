// What the parts of ampactor-bench-overlap share: the workloads, the modes and the timings.
#pragma once
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace ampactor;
using ampactor::bench::Clock;
using ampactor::bench::median_of;
using ampactor::bench::ms_since;
using nlohmann::json;

namespace ampactor::bench::overlap {

constexpr double kRatioGoal = 0.65;      // async / sync iteration time
constexpr double kWaitGoalShare = 0.02;  // time in scale() / iteration time, exact policy

/// Two training workloads with the same MLP, Linear(D, H) -> tanh -> Linear(H, D) and a mean
/// squared error:
/// - mlp: the MLP on dense inputs x[B, D]. At the small batch where Adam costs as much as
///   forward+backward, both halves are bound by memory traffic over the same few MB.
/// - embed: the MLP behind an embedding bag (the mean of `tokens` rows of a table[vocab, D] per
///   input row), as in a text classifier or a recommender. Most parameters are in the table,
///   which Adam streams through in full while forward+backward touches few of its rows: the
///   trainer's matmuls work on cache-sized blocks while the optimizer streams from memory, as a
///   GPU trainer and a host optimizer use different memory.
struct Workload {
  std::string kind;
  std::int64_t vocab, tokens, dim, hidden, batch;
  std::vector<at::Tensor> init;  // the same starting weights for every run
  at::Tensor x, y;

  Workload(std::string k, std::int64_t v, std::int64_t l, std::int64_t d, std::int64_t h,
           std::int64_t b)
      : kind(std::move(k)), vocab(v), tokens(l), dim(d), hidden(h), batch(b) {
    at::manual_seed(7);
    if (embed()) init.push_back(at::randn({v, d}) * 0.1);
    for (auto t : {at::randn({d, h}) * (1.0 / std::sqrt(double(d))), at::zeros({h}),
                   at::randn({h, d}) * (1.0 / std::sqrt(double(h))), at::zeros({d})})
      init.push_back(t);
    x = embed() ? at::randint(v, {b, l}, at::kLong) : at::randn({b, d});
    y = at::randn({b, d});
  }
  bool embed() const { return kind == "embed"; }
  std::vector<at::Tensor> fresh_params() const {
    std::vector<at::Tensor> p;
    for (const auto& t : init)
      p.push_back(t.clone().set_requires_grad(true));
    return p;
  }
  at::Tensor loss(const std::vector<at::Tensor>& w) const {
    const std::size_t o = embed() ? 1 : 0;
    const at::Tensor in = embed() ? at::embedding(w[0], x).mean(1) : x;
    at::Tensor h = at::tanh(at::matmul(in, w[o]) + w[o + 1]);
    return at::mse_loss(at::matmul(h, w[o + 2]) + w[o + 3], y);
  }
  std::int64_t params() const {
    return (embed() ? vocab * dim : 0) + 2 * dim * hidden + dim + hidden;
  }
  std::string describe() const {
    std::ostringstream s;
    if (embed())
      s << "embedding bag " << vocab << "x" << dim << " (" << tokens << " tokens a row) + ";
    s << "MLP " << dim << "x" << hidden << "x" << dim << " (" << params()
      << " parameters, fp32), batch " << batch;
    return s.str();
  }
};

struct Mode {
  std::string key, label;
  int staleness;  // -1: LocalGradScaler, no pipeline
  ScalePolicy policy;
  bool swap = false;
  // Control: the Adam step replaced by arithmetic within the core's own cache for as long as Adam
  // takes alone, then an SGD step. It does not compete with forward+backward for memory, as a
  // host optimizer beside a GPU trainer does not, so it shows what the pipeline itself overlaps.
  bool in_cache_step = false;
  bool defer = false;  // AsyncOptimizerOptions::defer_grad_move
  bool fused = false;  // ampactor::optim::FusedAdam instead of torch::optim::Adam
};

struct Timing {
  double iter_ms = 0;   // whole loop, final sync included, per iteration
  double scale_ms = 0;  // in scale(): the exact policy's wait for the scale, per iteration
  double step_ms = 0;   // in the pipeline's step(): the waited copy and grad move, per iteration
};

struct Config {
  std::string kind;
  std::int64_t vocab, tokens, dim, hidden, batch;  // batch 0: fitted
  // What forward+backward is balanced against when the batch is fitted: "adam", the Adam step
  // alone; "step", the synchronous pipeline's whole step (grad move, Adam, weight copy, hand-offs),
  // which is what a synchronous trainer waits for after its backward.
  std::string balance = "step";
};

inline const Mode kSyncMode{"sync", "pipeline, staleness 0 (synchronous)", 0, ScalePolicy::exact};

/// Forward+backward and an Adam step, each timed alone on this thread (ms).
std::pair<double, double> cost_ms(const Workload& w, int reps);
/// How in-cache arithmetic, cache copies and memory copies slow down on both cores at once.
json machine_probe();
/// Forward+backward here and Adam on another thread at the same time: the medians (ms).
std::pair<double, double> concurrent_cost_ms(const Workload& w, int reps);
/// Busy the core for `ms` with a matmul whose operands stay in its own cache.
void in_cache_work(double ms);
/// `iters` iterations of one mode after `warmup` untimed ones.
Timing run(const Workload& w, const Mode& m, int iters, int warmup, double adam_ms);
/// One workload: fit the batch, probe, run every mode interleaved, print and return the figures.
json bench_workload(const Config& c, int rounds, int iters, int warmup, bool quick);

}  // namespace ampactor::bench::overlap
