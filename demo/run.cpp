// One training run of the demo per mode: the model, the optimizer pipeline, the burst, the probes.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/keeper/taps.h>
#include <ampactor/metrics/metrics.h>
#ifdef AMPACTOR_TENSORBOARD
#include <ampactor/metrics/tensorboard.h>
#endif
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/trace.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "demo.h"

namespace demo {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  int k;
  double loss, scale;
  bool skipped;
  double ms;
};

struct Probe {
  int k;
  double eval_loss;
  double underflow = -1, act_underflow = -1;  // -1: not measured (fp32)
};

double eval_loss(const std::vector<at::Tensor>& weights, const ModelShape& shape,
                 const Corpus& corpus, const Settings& s, int batches) {
  at::AutoGradMode no_grad(false);
  std::mt19937_64 rng(s.seed + 999);
  std::vector<at::Tensor> w;
  for (const auto& t : weights)
    w.push_back(t.detach().to(at::kFloat));
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    auto [x, y] = corpus.batch(rng, s.batch, shape.context, true);
    sum += CharMlp::loss_fp32(w, x.to(w[0].device()), y.to(w[0].device())).item<double>();
  }
  return sum / batches;
}

/// fp32 gradients of the same batch with the model's current weights, for the underflow probe.
std::vector<at::Tensor> fp32_grads(const std::vector<at::Tensor>& weights, const at::Tensor& x,
                                   const at::Tensor& y) {
  std::vector<at::Tensor> w;
  for (const auto& t : weights)
    w.push_back(t.detach().to(at::kFloat).set_requires_grad(true));
  CharMlp::loss_fp32(w, x, y).backward();
  std::vector<at::Tensor> g;
  for (auto& t : w)
    g.push_back(t.grad());
  return g;
}

void write_csvs(const std::string& out, const std::string& mode, const std::vector<Row>& rows,
                const std::vector<Probe>& probes) {
  std::ofstream f(out + "/" + mode + ".csv");
  f << "iteration,loss,scale,skipped,ms\n";
  for (const Row& r : rows)
    f << r.k << ',' << std::setprecision(9) << r.loss << ',' << r.scale << ',' << int(r.skipped)
      << ',' << std::setprecision(4) << r.ms << '\n';
  std::ofstream p(out + "/" + mode + ".probe.csv");
  p << "iteration,eval_loss,weight_grad_underflow,activation_grad_underflow\n";
  for (const Probe& r : probes)
    p << r.k << ',' << std::setprecision(9) << r.eval_loss << ',' << r.underflow << ','
      << r.act_underflow << '\n';
  if (!f || !p) throw std::runtime_error("cannot write the CSVs of " + mode + " under " + out);
}

}  // namespace

/// Adam's second moments of gradients this small reach fp32's denormal range, where x86
/// arithmetic is 5-10x slower. Flushing them changes nothing fp16 could represent (its smallest
/// value is 6e-8). The mode is per thread: this thread and its OpenMP team.
void flush_denormals() {
  at::globalContext().setFlushDenormal(true);
#pragma omp parallel num_threads(at::get_num_threads())
  { at::globalContext().setFlushDenormal(true); }
}

std::string trace_file(const Settings& s, const std::string& mode) {
  if (s.trace.empty() || !scaled(mode)) return {};
  const auto n = std::count_if(s.modes.begin(), s.modes.end(), scaled);
  if (n == 1) return s.trace;
  const std::filesystem::path p(s.trace);
  return (p.parent_path() / (p.stem().string() + "." + mode + p.extension().string())).string();
}

namespace {

/// What a mode name means, read once.
struct Mode {
  explicit Mode(const std::string& m)
      : name(m),
        fp32(m == "fp32"),
        lagged(m == "fp16-async-lagged" || m == "fp16-async-lagged-behind"),
        behind(m == "fp16-async-lagged-behind"),
        async(m == "fp16-async" || lagged || m == "fp16-deepspeed"),
        roundpipe(m == "fp16-roundpipe"),
        deepspeed(m == "fp16-deepspeed"),
        overlap(m == "fp16-overlap") {}
  std::string name;
  bool fp32, lagged, behind, async, roundpipe, deepspeed, overlap;
};

/// A mode's model and optimizer side: fp32 with torch's Adam alone, or fp16 with the scaler and
/// the pipeline, which owns its optimizer.
struct Trainer {
  Trainer(const Mode& m, const ModelShape& shape, const Settings& s)
      : mode(m), model(shape, m.fp32 ? at::kFloat : at::kHalf, s.seed, at::Device(s.device)) {
    if (m.fp32) {
      own_opt =
          std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(s.lr));
      opt = own_opt.get();
      return;
    }
    const auto so =
        (m.deepspeed ? ampactor::GradScalerOptions::deepspeed() : ampactor::GradScalerOptions())
            .init_scale(65536)
            .growth_interval(s.growth_interval)
            .enabled(scaled(m.name))
            .allow_fp16_grads(true)
            .ranks(s.ranks);
    // RoundPipe's rule, emulated: iteration k+1 scales with N as it was after update k-1, and
    // every overflow backs N off (demo/README.md); ampactor applies it through update(new_scale).
    if (m.roundpipe) {
      pending.emplace(so);
      pending->lazy_init();
    }
    const std::string trace = trace_file(s, m.name);
    auto keeper = ampactor::KeeperOptions().policy(m.lagged ? ampactor::ScalePolicy::lagged
                                                            : ampactor::ScalePolicy::exact);
    // Each scaled run's figures, per iteration: out/metrics/<mode>.jsonl, and TensorBoard's
    // events under out/tensorboard/<mode>/ (tensorboard --logdir out/tensorboard).
    if (scaled(m.name)) {
      metrics = std::make_shared<ampactor::Metrics>();
      std::filesystem::create_directories(s.out + "/metrics");
      metrics->sink(
          std::make_shared<ampactor::JsonlMetrics>(s.out + "/metrics/" + m.name + ".jsonl"));
#ifdef AMPACTOR_TENSORBOARD
      metrics->sink(
          std::make_shared<ampactor::TensorBoardMetrics>(s.out + "/tensorboard/" + m.name));
#endif
    }
    std::vector<std::shared_ptr<ampactor::KeeperTap>> taps;
    if (metrics) taps.push_back(metrics);
    if (!trace.empty()) taps.push_back(ampactor::record_trace(trace));
    if (taps.size() == 1) keeper.tap(taps.front());
    if (taps.size() > 1) keeper.tap(ampactor::tee_taps(taps));
    scaler = std::make_unique<ampactor::GradScaler>(so, keeper);
    scaler->run_on_optimizer(flush_denormals);  // the optimizer thread has a team of its own
    // Asynchronous runs take everything but the weight swap off the trainer's path (the same
    // numbers as without; doc/guide/async-pipeline.md).
    // fp16-overlap: each layer's step starts while backward goes on (the model's five
    // parameters in five buckets); it needs a fused optimizer, which equals LibTorch 1.13's Adam.
    // 2.x's Adam rounds its sqrt otherwise: there fp16-sync takes the fused one too, so that
    // fp16-overlap still compares with it bit for bit.
    pipe = std::make_unique<ampactor::AsyncOptimizer>(model.parameters(), *scaler,
                                                      ampactor::AsyncOptimizerOptions()
                                                          .staleness(m.async ? 1 : 0)
                                                          .optimizer_threads(1)
                                                          .swap_weights(m.async)
                                                          .defer_grad_move(m.async)
                                                          .overlap_backward(m.overlap)
                                                          .bucket_bytes(64 << 10)
                                                          .tap(metrics));
    pipe->name_parameters(model.named_parameters());  // the overflow reports name the layers
    const bool fused_sync = TORCH_VERSION_MAJOR >= 2 && m.name == "fp16-sync";
    if (((m.async || fused_sync) && s.optimizer == "fused") || m.overlap)
      opt = &pipe->make_optimizer<ampactor::optim::FusedAdam>(
          torch::optim::AdamOptions(s.lr), ampactor::optim::FusedOptions().threads(1));
    else
      opt = &pipe->make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(s.lr));
  }

  /// Backward of `l` and the step; the scale it was made with.
  double step(int k, const at::Tensor& l, const at::Tensor& x, const at::Tensor& y, bool probe_now,
              Probe& probe, const Settings& s) {
    if (mode.fp32) {
      l.backward();
      opt->step();
      return 1;
    }
    {
      std::optional<BoundaryProbe> bp;
      if (probe_now) bp.emplace();
      scaler->scale(l).backward();
      if (bp) {
        act_nonzero += bp->nonzero(), act_lost += bp->lost();
        probe.act_underflow = bp->nonzero() > 0 ? bp->lost() / bp->nonzero() : 0;
      }
    }
    const double scale = scaler->get_scale();
    if (probe_now) {
      std::vector<at::Tensor> g;
      for (auto& p : model.parameters())
        g.push_back(p.grad());
      probe.underflow = underflow_fraction(g, fp32_grads(model.parameters(), x, y));
      underflow_sum += probe.underflow;
      ++underflow_probes;
    }
    // An optimizer behind the trainer (as a CPU optimizer over a large model): a job that only
    // waits, queued ahead of the step's, so the step's unscale report comes after the next
    // iteration's scale request. The exact policy would wait for it; lagged answers at once.
    if (mode.behind)
      scaler->submit(
          [ms = s.behind_ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); },
          ampactor::SubmitOptions().unscales(ampactor::UnscalePermit::none()));
    pipe->step(*opt, [this] { scaler->step(*opt); });
    if (mode.roundpipe) {
      if (k >= 1) pending->update(scaler->wait_result(k - 1).skipped());
      scaler->update(double(pending->scale()));
    } else {
      scaler->update();
    }
    return scale;
  }

  Mode mode;
  CharMlp model;
  std::shared_ptr<ampactor::Metrics> metrics;  // scaled runs: given to the keeper and the pipeline
  std::optional<ampactor::ScaleState> pending;
  std::unique_ptr<torch::optim::Adam> own_opt;  // fp32's
  std::unique_ptr<ampactor::GradScaler> scaler;
  std::unique_ptr<ampactor::AsyncOptimizer> pipe;
  torch::optim::Optimizer* opt = nullptr;
  double underflow_sum = 0, act_nonzero = 0, act_lost = 0;
  int underflow_probes = 0;
};

/// How many iterations each layer's gradients overflowed in, in the order they first did.
struct LayerCounts {
  std::vector<std::pair<std::string, int>> layers;
  void add(const std::vector<ampactor::OverflowTensor>& overflow) {
    for (const ampactor::OverflowTensor& o : overflow) {
      auto it = std::find_if(layers.begin(), layers.end(),
                             [&](const auto& l) { return l.first == o.name; });
      if (it == layers.end()) it = layers.insert(layers.end(), {o.name, 0});
      ++it->second;
    }
  }
  std::string str() const {
    std::string out;
    for (const auto& [name, n] : layers)
      out += (out.empty() ? "" : ", ") + name + " " + std::to_string(n);
    return out;
  }
};

/// The run's figures from its rows, once every step has run.
Summary summarize(Trainer& t, std::vector<Row>& rows, const Corpus& corpus, const ModelShape& shape,
                  const Settings& s, Clock::time_point t0) {
  Summary sum;
  sum.mode = t.mode.name;
  if (t.pipe) {
    t.pipe->sync();
    t.scaler->sync();
    LayerCounts all, burst;
    for (int k = 0; k < s.steps; ++k) {
      const ampactor::IterationResult r = t.scaler->wait_result(k);
      rows[std::size_t(k)].skipped = r.skipped();
      all.add(r.overflow);
      if (s.in_spike(k)) burst.add(r.overflow);
    }
    sum.overflowed = all.str();
    sum.burst_overflowed = burst.str();
    sum.final_scale = t.scaler->get_scale();
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
  sum.eval_loss =
      eval_loss(t.pipe ? t.pipe->optim_parameters() : t.model.parameters(), shape, corpus, s, 8);
  sum.underflow = t.underflow_probes ? t.underflow_sum / t.underflow_probes : -1;
  sum.act_underflow = t.act_nonzero > 0 ? t.act_lost / t.act_nonzero : -1;
  return sum;
}

}  // namespace

Summary run(const std::string& mode, const Corpus& corpus, const ModelShape& shape,
            const Settings& s) {
  Trainer t(Mode(mode), shape, s);
  const at::Device device(s.device);
  std::mt19937_64 rng(s.seed);
  std::set<int> inject;
  if (scaled(mode)) inject.insert(s.overflow_at.begin(), s.overflow_at.end());
  std::vector<Row> rows;
  std::vector<Probe> probes;
  const auto t0 = Clock::now();
  const int report = std::max(1, s.steps / 10);
  for (int k = 0; k < s.steps; ++k) {
    const auto it0 = Clock::now();
    // The burst: spike_factor times the batch, normalised as the usual one (a packing change the
    // loss's normaliser does not follow), so the gradients grow about that much.
    const bool spike = s.in_spike(k);
    const std::int64_t factor = spike ? s.spike_factor : 1;
    auto [xc, yc] = corpus.batch(rng, s.batch * factor, shape.context, false);
    if (s.world > 1) {  // data parallel: every rank draws the batch, each trains on its shard
      xc = xc.chunk(s.world)[s.rank];
      yc = yc.chunk(s.world)[s.rank];
    }
    const at::Tensor x = xc.to(device), y = yc.to(device);
    t.model.zero_grad();
    at::Tensor loss = t.model.loss(x, y);
    const double loss_v = loss.item<double>();
    at::Tensor l = loss * (double(factor) / s.workers);
    if (inject.count(k)) l = l * 1e5 * s.workers;  // a forced overflow
    const bool probe_now =
        s.probe_every > 0 && k % s.probe_every == 0 && !inject.count(k) && !spike;
    Probe probe{k, 0};
    if (probe_now) probe.eval_loss = eval_loss(t.model.parameters(), shape, corpus, s, 2);
    const double scale = t.step(k, l, x, y, probe_now, probe, s);
    if (probe_now) probes.push_back(probe);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - it0).count();
    rows.push_back({k, loss_v, scale, false, ms});
    if (s.rank == 0 && ((k + 1) % report == 0 || k + 1 == s.steps))
      std::cout << "  [" << mode << "] " << std::setw(4) << k + 1 << "/" << s.steps << "  loss "
                << std::fixed << std::setprecision(3) << loss_v << "  scale " << std::defaultfloat
                << scale << std::endl;
  }
  const Summary sum = summarize(t, rows, corpus, shape, s, t0);
  write_csvs(s.out, mode, rows, probes);
  return sum;
}

}  // namespace demo
