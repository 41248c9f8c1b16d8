// ampactor-bench-overlap: what the asynchronous optimizer buys. The same training workload (an
// MLP, Adam over fp32 masters, the exact policy) runs with the pipeline synchronous (staleness 0)
// and asynchronous (staleness 1), side by side in one run, with the batch chosen so that the
// optimizer step costs about as much as forward+backward. It also measures how long the main
// thread waits in scale() (the ScaleRequest of the exact policy) as a share of iteration time.
// One LibTorch thread on each side: the trainer's and the optimizer's, one core each.
// Two controls explain the result on a given machine: how much slower in-cache arithmetic, cache
// copies and memory copies run on both cores at once than alone, and the pipeline with the Adam
// step replaced by in-cache arithmetic of the same cost (no competition for memory).
// Not a test: it reports figures and goals and never fails on them.
#include <ampactor/async_optimizer.h>
#include <ampactor/grad_scaler.h>
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

namespace {

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

/// Forward+backward and an Adam step, each timed alone on this thread.
std::pair<double, double> cost_ms(const Workload& w, int reps) {
  auto p = w.fresh_params();
  torch::optim::Adam opt(p, torch::optim::AdamOptions(1e-4));
  std::vector<double> f, o;
  for (int i = 0; i < reps + 2; ++i) {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
    auto t0 = Clock::now();
    w.loss(p).backward();
    const double fb = ms_since(t0);
    t0 = Clock::now();
    opt.step();
    const double st = ms_since(t0);
    if (i >= 2) f.push_back(fb), o.push_back(st);
  }
  return {median_of(f), median_of(o)};
}

/// How the machine's two cores share it: a kernel timed alone on this thread, then on two threads
/// at once (one on each core, separate buffers). Returns (alone, mean of the two together) in ms.
template <class F>
std::pair<double, double> alone_and_together(F kernel) {
  const double alone = kernel();
  double r[2];
  std::thread other([&] {
    at::get_num_threads();
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    r[1] = kernel();
  });
  r[0] = kernel();
  other.join();
  return {alone, 0.5 * (r[0] + r[1])};
}

/// Three kinds of work, each alone and on both cores at once: a matmul whose operands fit the
/// core's own cache, copies within the shared last-level cache, and copies from main memory.
json machine_probe() {
  auto matmul = [] {
    auto a = at::randn({128, 128}), b = at::randn({128, 128}), c = at::empty({128, 128});
    at::mm_out(c, a, b);
    const auto t0 = Clock::now();
    for (int i = 0; i < 2000; ++i)
      at::mm_out(c, a, b);
    return ms_since(t0);
  };
  auto copies = [](std::int64_t bytes, int reps) {
    return [=] {
      auto a = at::ones({bytes / 4}), b = at::empty({bytes / 4});
      b.copy_(a);
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i)
        b.copy_(a);
      return ms_since(t0);
    };
  };
  json res;
  std::cout << "machine: time alone -> on both cores at once (each)\n";
  for (auto& [key, label, kernel] :
       std::vector<std::tuple<std::string, std::string, std::function<double()>>>{
           {"matmul_in_core_cache", "matmul 128x128 (in the core's cache)", matmul},
           {"copy_4MiB_last_level_cache", "copy 4 MiB (last-level cache)", copies(4 << 20, 1000)},
           {"copy_128MiB_memory", "copy 128 MiB (main memory)", copies(128 << 20, 10)}}) {
    const auto [alone, together] = alone_and_together(kernel);
    res[key] = {{"alone_ms", alone}, {"together_ms", together}, {"slowdown", together / alone}};
    std::cout << "  " << std::left << std::setw(40) << label << std::right << std::fixed
              << std::setprecision(1) << std::setw(8) << alone << " ms -> " << std::setw(7)
              << together << " ms (" << std::setprecision(2) << together / alone << "x)\n";
  }
  return res;
}

/// Forward+backward on this thread and Adam steps on another thread (its own parameters), at the
/// same time: how much the two slow each other down when they share the machine (memory
/// bandwidth, the last-level cache). Returns the medians (forward+backward, Adam step).
std::pair<double, double> concurrent_cost_ms(const Workload& w, int reps) {
  auto p = w.fresh_params();
  std::atomic<bool> stop{false};
  std::vector<double> o;
  std::thread other([&] {
    at::get_num_threads();
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    auto q = w.fresh_params();
    for (auto& t : q)
      t.mutable_grad() = at::ones_like(t);
    torch::optim::Adam opt(q, torch::optim::AdamOptions(1e-4));
    while (!stop.load()) {
      const auto t0 = Clock::now();
      opt.step();
      o.push_back(ms_since(t0));
    }
  });
  std::vector<double> f;
  for (int i = 0; i < reps + 2; ++i) {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
    const auto t0 = Clock::now();
    w.loss(p).backward();
    if (i >= 2) f.push_back(ms_since(t0));
  }
  stop = true;
  other.join();
  return {median_of(f), median_of(o)};
}

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
};

/// Busy the core for `ms` with a matmul whose operands stay in its own cache.
void in_cache_work(double ms) {
  static thread_local at::Tensor a = at::randn({96, 96}), b = at::randn({96, 96}),
                                 c = at::empty({96, 96});
  const auto t0 = Clock::now();
  while (ms_since(t0) < ms)
    at::mm_out(c, a, b);
}

struct Timing {
  double iter_ms = 0;   // whole loop, final sync included, per iteration
  double scale_ms = 0;  // in scale(): the exact policy's wait for the scale, per iteration
  double step_ms = 0;   // in the pipeline's step(): the waited copy and grad move, per iteration
};

Timing run(const Workload& w, const Mode& m, int iters, int warmup, double adam_ms) {
  // A constant scale: no skipped steps muddle the timing.
  const auto so = GradScalerOptions().init_scale(1024).growth_interval(1 << 30);
  auto params = w.fresh_params();
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<AsyncOptimizer> pipe;
  std::unique_ptr<LocalGradScaler> local;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (m.staleness < 0) {
    local = std::make_unique<LocalGradScaler>(so);
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-4));
  } else {
    scaler = std::make_unique<GradScaler>(so, m.policy);
    pipe = std::make_unique<AsyncOptimizer>(params, *scaler,
                                            AsyncOptimizerOptions()
                                                .staleness(m.staleness)
                                                .optimizer_threads(1)
                                                .swap_weights(m.swap)
                                                .defer_grad_move(m.defer));
    if (m.in_cache_step)
      opt = std::make_unique<torch::optim::SGD>(pipe->optim_parameters(),
                                                torch::optim::SGDOptions(1e-4));
    else
      opt = std::make_unique<torch::optim::Adam>(pipe->optim_parameters(),
                                                 torch::optim::AdamOptions(1e-4));
  }
  Timing t;
  Clock::time_point start;
  for (int k = 0; k < warmup + iters; ++k) {
    if (k == warmup) start = Clock::now(), t = Timing{};
    for (auto& p : params)
      p.mutable_grad() = at::Tensor();
    at::Tensor loss = w.loss(params);
    if (local) {
      local->scale(loss).backward();
      local->step(*opt);
      local->update();
      continue;
    }
    auto t0 = Clock::now();
    at::Tensor scaled = scaler->scale(loss);
    t.scale_ms += ms_since(t0);
    scaled.backward();
    t0 = Clock::now();
    pipe->step(*opt, [&] {
      if (m.in_cache_step) in_cache_work(adam_ms);
      scaler->step(*opt);
    });
    t.step_ms += ms_since(t0);
    scaler->update();
  }
  if (pipe) pipe->sync();
  if (scaler) scaler->sync();
  t.iter_ms = ms_since(start) / iters;
  t.scale_ms /= iters;
  t.step_ms /= iters;
  return t;
}

struct Config {
  std::string kind;
  std::int64_t vocab, tokens, dim, hidden, batch;  // batch 0: fitted
  // What forward+backward is balanced against when the batch is fitted: "adam", the Adam step
  // alone; "step", the synchronous pipeline's whole step (grad move, Adam, weight copy, hand-offs),
  // which is what a synchronous trainer waits for after its backward.
  std::string balance = "step";
};

const Mode kSyncMode{"sync", "pipeline, staleness 0 (synchronous)", 0, ScalePolicy::exact};

/// One workload: fit the batch, probe the costs alone and together, run every mode interleaved
/// over the rounds, print the table and return the figures.
json bench_workload(const Config& c, int rounds, int iters, int warmup, bool quick) {
  auto make = [&](std::int64_t b) {
    return Workload(c.kind, c.vocab, c.tokens, c.dim, c.hidden, b);
  };
  // Choose the batch: forward+backward grows about linearly with it, the optimizer side does not.
  // Fit the line through two batches and solve for forward+backward = the balanced cost.
  std::int64_t b = c.batch;
  const int reps = quick ? 3 : 7;
  auto sync_step_ms = [&](const Workload& w) {
    std::vector<double> st;
    for (int i = 0; i < 3; ++i)
      st.push_back(run(w, kSyncMode, quick ? 5 : 20, warmup, 0).step_ms);
    return median_of(st);
  };
  // What forward+backward should cost at the fitted batch, given the Adam step measured there.
  auto balanced_ms = [&](const Workload& w, double adam_ms) {
    return c.balance == "adam" ? adam_ms : sync_step_ms(w);
  };
  if (b == 0) {
    // The embedding workload costs less per row (a narrow input), so its second point is further.
    const std::int64_t b1 = 8, b2 = c.kind == "embed" ? 512 : 128;
    const auto [f1, o1] = cost_ms(make(b1), reps);
    const auto [f2, o2] = cost_ms(make(b2), reps);
    const double slope = (f2 - f1) / double(b2 - b1);
    const double o = balanced_ms(make(b1), 0.5 * (o1 + o2));
    b = slope > 0 ? std::int64_t(double(b1) + (o - f1) / slope + 0.5) : b1;
    b = std::clamp<std::int64_t>(b, 1, 1 << 16);
    // Two points far apart fit the line only roughly (this machine's timings drift): check at
    // the chosen batch and correct along the slope while the two sides differ by over 10%.
    for (int i = 0; i < 2 && slope > 0 && !quick; ++i) {
      const Workload at_b = make(b);
      const auto [fb, adam] = cost_ms(at_b, reps);
      const double target = balanced_ms(at_b, adam);
      if (std::abs(fb - target) <= 0.1 * target) break;
      b = std::clamp<std::int64_t>(std::int64_t(double(b) + (target - fb) / slope + 0.5), 1,
                                   1 << 16);
    }
  }
  const Workload w = make(b);
  const auto [fb_ms, opt_ms] = cost_ms(w, reps);
  const double step_ms_sync = sync_step_ms(w);
  const auto [fb_conc_ms, opt_conc_ms] = concurrent_cost_ms(w, 4 * reps);
  std::cout << "\n== workload " << c.kind << ": " << w.describe() << ", Adam, exact policy\n"
            << "batch " << (c.batch ? "given" : "fitted") << ", balance " << c.balance
            << ": forward+backward against "
            << (c.balance == "adam" ? "the Adam step alone"
                                    : "the synchronous pipeline's whole step")
            << "\n"
            << "alone on one thread: forward+backward " << std::fixed << std::setprecision(2)
            << fb_ms << " ms, Adam step " << opt_ms << " ms (ratio " << opt_ms / fb_ms << ")\n"
            << "synchronous pipeline's step (grad move, Adam, weight copy, hand-offs): "
            << step_ms_sync << " ms (ratio " << step_ms_sync / fb_ms << ")\n"
            << "both at once, one on each core: forward+backward " << fb_conc_ms
            << " ms, Adam step " << opt_conc_ms << " ms (" << fb_conc_ms / fb_ms << "x and "
            << opt_conc_ms / opt_ms << "x alone)\n"
            << rounds << " rounds x " << iters << " iterations per mode, order rotating\n";

  const std::vector<Mode> modes = {
      {"local", "LocalGradScaler, no pipeline (reference)", -1, ScalePolicy::exact},
      kSyncMode,
      {"async", "pipeline, staleness 1 (asynchronous)", 1, ScalePolicy::exact},
      {"async_lagged", "pipeline, staleness 1, lagged policy", 1, ScalePolicy::lagged},
      {"async_swap", "pipeline, staleness 1, swap_weights", 1, ScalePolicy::exact, true},
      {"async_defer", "pipeline, staleness 1, defer_grad_move", 1, ScalePolicy::exact, false, false,
       true},
      {"async_defer_swap", "pipeline, staleness 1, defer + swap", 1, ScalePolicy::exact, true,
       false, true},
      {"sync_in_cache", "control: sync, in-cache optimizer step", 0, ScalePolicy::exact, false,
       true},
      {"async_in_cache", "control: async, in-cache optimizer step", 1, ScalePolicy::exact, false,
       true},
      {"async_defer_swap_in_cache", "control: defer + swap, in-cache step", 1, ScalePolicy::exact,
       true, true, true},
  };
  std::vector<std::vector<Timing>> got(modes.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < modes.size(); ++i) {
      const std::size_t m = (i + std::size_t(r)) % modes.size();
      got[m].push_back(run(w, modes[m], iters, warmup, opt_ms));
    }
    std::cout << "  round " << r + 1 << "/" << rounds << " done" << std::endl;
  }

  json res = {{"description", w.describe()},
              {"vocab", w.embed() ? w.vocab : 0},
              {"tokens", w.embed() ? w.tokens : 0},
              {"dim", w.dim},
              {"hidden", w.hidden},
              {"batch", b},
              {"balance", c.balance},
              {"sync_pipeline_step_ms", step_ms_sync},
              {"parameters", w.params()},
              {"forward_backward_ms", fb_ms},
              {"adam_step_ms", opt_ms},
              {"forward_backward_concurrent_ms", fb_conc_ms},
              {"adam_step_concurrent_ms", opt_conc_ms},
              {"rounds", rounds},
              {"iterations", iters}};
  std::vector<double> med(modes.size()), scale_share(modes.size()), step_ms(modes.size());
  std::cout << "\n"
            << std::left << std::setw(42) << "mode" << std::right << std::setw(10) << "ms/iter"
            << std::setw(12) << "in scale()" << std::setw(10) << "share" << std::setw(12)
            << "in step()"
            << "\n";
  for (std::size_t m = 0; m < modes.size(); ++m) {
    std::vector<double> it, sc, st, share;
    for (const Timing& t : got[m]) {
      it.push_back(t.iter_ms), sc.push_back(t.scale_ms), st.push_back(t.step_ms);
      share.push_back(t.scale_ms / t.iter_ms);
    }
    med[m] = median_of(it);
    scale_share[m] = median_of(share);
    step_ms[m] = median_of(st);
    res["modes"][modes[m].key] = {{"label", modes[m].label},
                                  {"iteration_ms_median", med[m]},
                                  {"iteration_ms_rounds", it},
                                  {"scale_wait_ms_median", median_of(sc)},
                                  {"scale_wait_share_median", scale_share[m]},
                                  {"step_wait_ms_median", step_ms[m]}};
    std::cout << std::left << std::setw(42) << modes[m].label << std::right << std::fixed
              << std::setprecision(2) << std::setw(10) << med[m];
    if (modes[m].staleness >= 0)
      std::cout << std::setw(9) << median_of(sc) * 1000 << " us" << std::setw(9)
                << 100 * scale_share[m] << "%" << std::setw(9) << step_ms[m] << " ms";
    std::cout << "\n";
  }
  // Ratios per round (each round ran every mode side by side), then their median.
  auto index = [&](const std::string& key) {
    return std::size_t(
        std::find_if(modes.begin(), modes.end(), [&](const Mode& m) { return m.key == key; }) -
        modes.begin());
  };
  auto ratio_to_sync = [&](std::size_t m, std::size_t sync) {
    std::vector<double> r;
    for (int i = 0; i < rounds; ++i)
      r.push_back(got[m][std::size_t(i)].iter_ms / got[sync][std::size_t(i)].iter_ms);
    return r;
  };
  std::cout << "\n";
  for (std::size_t m :
       {index("async"), index("async_swap"), index("async_defer"), index("async_defer_swap")}) {
    const auto rs = ratio_to_sync(m, index("sync"));
    const double ratio = median_of(rs);
    const double wait = scale_share[m];
    res["goals"][modes[m].key] = {{"async_over_sync", ratio},
                                  {"async_over_sync_rounds", rs},
                                  {"async_over_sync_max", kRatioGoal},
                                  {"async_over_sync_met", ratio <= kRatioGoal},
                                  {"exact_scale_wait_share", wait},
                                  {"exact_scale_wait_share_max", kWaitGoalShare},
                                  {"exact_scale_wait_met", wait <= kWaitGoalShare}};
    std::cout << c.kind << ", " << modes[m].label << ":\n  async / sync iteration time "
              << std::setprecision(3) << ratio
              << " (median of per-round ratios; goal <= " << kRatioGoal << ": "
              << (ratio <= kRatioGoal ? "met" : "NOT met") << ")\n  time in scale() " << 100 * wait
              << "% of the iteration (goal <= " << 100 * kWaitGoalShare
              << "%: " << (wait <= kWaitGoalShare ? "met" : "NOT met") << ")\n";
  }
  const auto control = ratio_to_sync(index("async_in_cache"), index("sync_in_cache"));
  const auto control_ds = ratio_to_sync(index("async_defer_swap_in_cache"), index("sync_in_cache"));
  res["control_async_over_sync"] = median_of(control);
  res["control_async_over_sync_rounds"] = control;
  res["control_defer_swap_over_sync"] = median_of(control_ds);
  res["control_defer_swap_over_sync_rounds"] = control_ds;
  std::cout << "control (in-cache optimizer step, no competition for memory): async / sync "
            << median_of(control) << ", defer + swap / sync " << median_of(control_ds) << "\n";
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-overlap: asynchronous vs synchronous optimizer pipeline"};
  std::string workload = "mlp";
  Config mlp{"mlp", 0, 0, 512, 1024, 0};
  Config emb{"embed", 25000, 16, 256, 1024, 0};
  int rounds = 10, iters = 40, warmup = 3;
  std::string json_path;
  bool quick = false;
  app.add_option("--workload", workload, "mlp (the default), embed, or all (each in turn)")
      ->check(CLI::IsMember({"mlp", "embed", "all"}));
  app.add_option("--dim", mlp.dim, "mlp: the MLP's input and output width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--hidden", mlp.hidden, "mlp: the MLP's hidden width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--batch", mlp.batch,
                 "mlp: rows per iteration (0: fitted so that forward+backward costs about as "
                 "much as --balance says)")
      ->check(CLI::Range(0, 1 << 20));
  std::string balance = "step";
  app.add_option("--balance", balance,
                 "what a fitted batch balances forward+backward against: step (the synchronous "
                 "pipeline's whole optimizer step: grad move, Adam, weight copy; the default) or "
                 "adam (the Adam step alone)")
      ->check(CLI::IsMember({"step", "adam"}));
  app.add_option("--vocab", emb.vocab, "embed: the table's rows")->check(CLI::Range(16, 1 << 26));
  app.add_option("--embed-dim", emb.dim, "embed: the table's width (the MLP's input width)")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--embed-hidden", emb.hidden, "embed: the MLP's hidden width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--tokens", emb.tokens, "embed: table rows averaged per input row")
      ->check(CLI::Range(1, 1 << 12));
  app.add_option("--embed-batch", emb.batch, "embed: rows per iteration (0: fitted, as --batch)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--rounds", rounds, "interleaved rounds; each runs every mode")
      ->check(CLI::Range(1, 1000));
  app.add_option("--iterations", iters, "timed iterations per mode and round")
      ->check(CLI::Range(1, 100000));
  app.add_option("--json", json_path, "write the figures as JSON to this file");
  app.add_flag("--quick", quick, "small models and few rounds (a smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    mlp.dim = 256, mlp.hidden = 512, rounds = 2, iters = 5;
    emb.vocab = 1 << 14, emb.dim = 64, emb.hidden = 256;
  }
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);
    if (!json_file) {
      std::cerr << "--json: cannot write " << json_path << "\n";
      return 2;
    }
  }
  // Keep freed tensors' memory in the process, as LibTorch's GPU caching allocator does: glibc
  // otherwise maps and unmaps every large gradient, and its page faults cost as much as the
  // arithmetic on this scale, for every mode alike.
  // 32 MiB is glibc's largest threshold; the default workloads keep every tensor below it.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);
  at::get_num_threads();  // LibTorch's per-thread lazy set-up, before any other thread's
  std::cout << "ampactor-bench-overlap: LibTorch " << TORCH_VERSION << ", "
            << std::thread::hardware_concurrency()
            << " hardware threads; one LibTorch thread for the trainer, one for the optimizer\n";

  json res = {{"benchmark", "ampactor-bench-overlap"},
              {"torch", TORCH_VERSION},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"machine", machine_probe()}};
  mlp.balance = emb.balance = balance;
  for (const Config& c : {mlp, emb})
    if (workload == "all" || workload == c.kind)
      res["workloads"][c.kind] = bench_workload(c, rounds, iters, warmup, quick);
  if (!json_path.empty()) {
    json_file << std::setw(2) << res << "\n";
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}
