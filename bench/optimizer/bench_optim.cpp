// ampactor-bench-optim: the fused scaled optimizer step against today's pipeline optimizer side
// (the fused grad move + LibTorch's torch::optim::Adam + the masters cast to the weights) and
// against the machine's ceiling (a read+write stream moving the bytes the step must read and
// write), side by side: each repetition runs every side in turn, in an order that rotates from
// one repetition to the next, and the ratios are the medians of each repetition's own ratio. A
// fourth side runs the fused step with plain stores for the weights (the default streams them
// beyond the cache). The optimizer sides step copies of the same masters with the same grads, so
// they must end bit for bit equal (checked and printed).
#include <ampactor/kernels/fused_step.h>
#include <ampactor/kernels/unscale.h>
#include <ampactor/optim/fused.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <omp.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <thread>

#include "bench_setup.h"
#include "bench_util.h"

namespace ampactor::bench {
nlohmann::json pipeline_threads(const std::vector<std::int64_t>& sizes, int reps);
}

using ampactor::bench::Clock;
using ampactor::bench::median_of;

namespace {

// A model's mix: 64 tensors log-uniform over a 1000x range of sizes, `n` elements in all.
std::vector<std::int64_t> sizes_of(std::int64_t n) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, std::log(1000.0));
  std::vector<double> w(64);
  double sum = 0;
  for (double& x : w)
    sum += (x = std::exp(u(rng)));
  std::vector<std::int64_t> out;
  for (double x : w)
    out.push_back(std::max<std::int64_t>(1, std::int64_t(double(n) * x / sum)));
  return out;
}

// The read+write stream ceiling: every 64-bit word of `words` read and written back (float signs
// flipped), split evenly over `threads` threads of one region, as the kernel bench's r+w stream.
void rmw_stream(std::uint64_t* words, std::int64_t n, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    for (std::int64_t i = lo; i < hi; ++i)
      words[i] ^= 0x8000000080000000ull;
  }
}

double secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool bits_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].data_ptr(), b[i].data_ptr(), a[i].nbytes()) != 0) return false;
  return true;
}

/// The command line.
struct Settings {
  std::vector<double> mib = {1, 16, 64};
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> dtypes = {"half"};
  int reps = 7;
  std::string json_path;
  std::int64_t pipeline_mparams = 16;
  int settle_ms = 0;
};

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--mparams", s.mib, "parameter counts, in Mi (2^20; 0.0625: 64 Ki, in cache)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", s.thread_counts, "thread counts");
  app.add_option("--dtype", s.dtypes, "model dtypes: half, bfloat16");
  app.add_option("--reps", s.reps, "repetitions (medians)")->check(CLI::PositiveNumber);
  app.add_option("--json", s.json_path, "write the figures here");
  app.add_option("--pipeline-mparams", s.pipeline_mparams,
                 "parameters (Mi) of the pipeline's thread comparison (0: skip it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--settle-ms", s.settle_ms,
                 "idle time before each timed side, so that the OpenMP workers the side before "
                 "left spinning have gone to sleep (0: none)")
      ->check(CLI::NonNegativeNumber);
}

/// One model's tensors, a copy for each optimizer side.
struct Model {
  std::vector<at::Tensor> grads, today_masters, today_master_grads, fused_masters, today_weights,
      fused_weights, plain_masters, plain_weights;
  std::int64_t total = 0;

  Model(const std::vector<std::int64_t>& sizes, at::ScalarType dt) {
    for (std::int64_t n : sizes) {
      total += n;
      at::Tensor w = at::randn({n}) * 0.1;
      grads.push_back((at::randn({n}) * 64).to(dt));
      today_masters.push_back(w.clone());
      today_master_grads.push_back(at::zeros({n}));
      today_masters.back().mutable_grad() = today_master_grads.back();
      fused_masters.push_back(w.clone());
      plain_masters.push_back(w.clone());
      today_weights.push_back(w.to(dt));
      fused_weights.push_back(w.to(dt));
      plain_weights.push_back(w.to(dt));
    }
  }

  /// Whether the optimizer sides ended bit for bit equal.
  bool same() const {
    return bits_equal(today_masters, fused_masters) && bits_equal(today_weights, fused_weights) &&
           bits_equal(today_masters, plain_masters) && bits_equal(today_weights, plain_weights);
  }
};

/// Each side's time of every repetition, in seconds.
struct Times {
  std::vector<double> today, fused, copy, plain;
};

/// The four sides on `threads` threads, `reps` repetitions after a warm-up round.
Times time_sides(Model& md, std::vector<std::uint64_t>& words, int threads, int reps,
                 int settle_ms) {
  // libgomp's idle workers spin for a while after a parallel region (GOMP_SPINCOUNT): a side
  // started inside that time shares its cores with them. A gap trades that for waking idle
  // cores (on this VM, up to several ms for a halted vCPU), so it is off unless asked for.
  const auto settle = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms)); };
  at::set_num_threads(threads);
  torch::optim::Adam today(md.today_masters, torch::optim::AdamOptions(1e-3));
  ampactor::optim::FusedAdam fused(md.fused_masters, torch::optim::AdamOptions(1e-3),
                                   ampactor::optim::FusedOptions().threads(threads));
  ampactor::optim::FusedAdam plain(md.plain_masters, torch::optim::AdamOptions(1e-3),
                                   ampactor::optim::FusedOptions().threads(threads));
  const float inv = 1.0f / 65536;
  Times t;
  // The four sides; each repetition runs them in a rotated order, so that none always
  // follows the same one (a side finds in the cache what the one before left there).
  auto today_side = [&] {
    at::Tensor f = at::zeros({}, at::kFloat);
    ampactor::kernels::move_grads_and_unscale(md.grads, md.today_master_grads, inv, f);
    if (f.item<float>() == 0) today.step();
    for (std::size_t i = 0; i < md.today_weights.size(); ++i)
      md.today_weights[i].copy_(md.today_masters[i]);
  };
  auto fused_side = [&](ampactor::optim::FusedAdam& opt, std::vector<at::Tensor>& weights) {
    at::Tensor f = at::zeros({}, at::kFloat);
    ampactor::kernels::check_finite(md.grads, f);
    opt.step_scaled(
        ampactor::optim::ScaledStep().inv_scale(inv).found_inf(f).grads(md.grads).weights(weights));
  };
  const std::function<void()> sides[4] = {
      today_side, [&] { fused_side(fused, md.fused_weights); },
      [&] {  // plain stores for the weights (the default streams them beyond the cache)
        ampactor::kernels::set_stream_weights(false);
        fused_side(plain, md.plain_weights);
        ampactor::kernels::set_stream_weights(true);
      },
      [&] { rmw_stream(words.data(), std::int64_t(words.size()), threads); }};
  std::vector<double>* times[4] = {&t.today, &t.fused, &t.plain, &t.copy};
  for (int r = 0; r < reps + 1; ++r) {  // the first round warms up (state allocation)
    for (int k = 0; k < 4; ++k) {
      const int side = (r + k) % 4;
      settle();
      const auto t0 = Clock::now();
      sides[side]();
      if (r > 0) times[side]->push_back(secs(t0));
    }
  }
  return t;
}

/// One row of the table, printed and returned.
nlohmann::json report_row(double m, const std::string& dname, int threads, const Times& t,
                          bool same) {
  const double ta = median_of(t.today) * 1e3, tb = median_of(t.fused) * 1e3,
               tc = median_of(t.copy) * 1e3, td = median_of(t.plain) * 1e3;
  // The ratios pair each repetition's sides, measured within a few ms of each other, so
  // that the machine's drift between repetitions cancels out.
  // today/ceiling bounds today/fused for any step that moves the ceiling's bytes.
  std::vector<double> today_by_fused, fused_by_ceiling, today_by_ceiling, plain_by_fused;
  for (std::size_t i = 0; i < t.fused.size(); ++i) {
    plain_by_fused.push_back(t.plain[i] / t.fused[i]);
    today_by_fused.push_back(t.today[i] / t.fused[i]);
    fused_by_ceiling.push_back(t.fused[i] / t.copy[i]);
    today_by_ceiling.push_back(t.today[i] / t.copy[i]);
  }
  const double rf = median_of(today_by_fused), rc = median_of(fused_by_ceiling),
               rt = median_of(today_by_ceiling), rp = median_of(plain_by_fused);
  std::cout << std::setw(6) << std::defaultfloat << std::setprecision(4) << m << " Mi  "
            << std::setw(8) << dname << "  " << threads << "  | " << std::fixed
            << std::setprecision(3) << std::setw(22) << ta << "  | " << std::setw(18) << tb
            << "  | " << std::setw(28) << tc << "  | " << std::setw(10) << rf << "x | "
            << std::setw(12) << rc << "x | " << std::setw(12) << rt << "x | " << std::setw(8) << td
            << " | " << std::setw(8) << rp << "x | " << (same ? "yes" : "NO") << "\n";
  return {{"mparams", m},
          {"dtype", dname},
          {"threads", threads},
          {"today_ms", ta},
          {"fused_ms", tb},
          {"ceiling_ms", tc},
          {"today_over_fused", rf},
          {"today_over_ceiling", rt},
          {"fused_over_ceiling", rc},
          {"fused_plain_stores_ms", td},
          {"plain_over_streamed", rp},
          {"same_masters", same}};
}

/// Every dtype, size and thread count: the table, and its rows.
nlohmann::json bench_steps(const Settings& s) {
  std::cout << "fused step loops: " << ampactor::kernels::fused_step_variant()
            << "; Adam (lr 1e-3, defaults), model grads and weights in the model dtype, fp32 "
               "masters; milliseconds per step, median of "
            << s.reps << "\n\n";
  std::cout
      << "  params  dtype     thr |  today (move+Adam+cast) |  fused (check+step) |  ceiling "
         "(r+w stream, 30 B/param) | today/fused | fused/ceiling | today/ceiling | plain st. | "
         "plain/fused | same masters\n";
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& dname : s.dtypes) {
    const at::ScalarType dt = dname == "bfloat16" ? at::kBFloat16 : at::kHalf;
    for (double m : s.mib) {
      Model md(sizes_of(std::int64_t(m * (1 << 20))), dt);
      // What the step reads and writes per parameter: the check reads the grad (2 B), the step
      // reads grad, master, exp_avg, exp_avg_sq (14 B) and writes them back and the weight (14 B).
      const std::int64_t moved = md.total * 30;
      std::vector<std::uint64_t> words(std::size_t(moved / 2 / 8), 1);
      for (int threads : s.thread_counts) {
        const Times t = time_sides(md, words, threads, s.reps, s.settle_ms);
        rows.push_back(report_row(m, dname, threads, t, md.same()));
      }
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The fused scaled optimizer step against today's optimizer side and the ceiling"};
  Settings s;
  add_options(app, s);
  CLI11_PARSE(app, argc, argv);

  nlohmann::json all = {{"steps", bench_steps(s)}};
  if (s.pipeline_mparams > 0) {
    at::set_num_threads(2);  // the trainer's team, as a trainer on both cores has
    all["pipeline"] = ampactor::bench::pipeline_threads(sizes_of(s.pipeline_mparams << 20), s.reps);
  }
  all["setup"] = ampactor::bench::run_setup();
  if (!s.json_path.empty()) std::ofstream(s.json_path) << all.dump(1) << "\n";
}
