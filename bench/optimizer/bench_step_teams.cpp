// ampactor-bench-step-teams: the fused Adam step (kernels::adam_step, 16 Mi fp16 parameters in 64
// tensors) on 1 and 2 threads, in three settings side by side, to show what LibTorch's idle
// OpenMP workers cost the kernels' pool and why the main thread's steps run on its OpenMP team:
// (a) on the pool (stepped from another thread), before the process has run any OpenMP region;
// (b) on the pool, right after a region of the main thread's team (as after any LibTorch op on 2
// threads: libgomp's worker then spins on the other core); (c) as (b), stepped from the main
// thread, so on that team (pool.h's run_shares). Medians of --reps, ms per step.
#include <ampactor/kernels/fused_step.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <iomanip>
#include <iostream>
#include <vector>

using ampactor::kernels::AdamConsts;
using ampactor::kernels::StepElem;
using ampactor::kernels::StepSpan;

namespace {

void omp_region(int threads) {  // a short region, as an op on a small tensor
#pragma omp parallel num_threads(threads)
  {
    volatile float z = 0;
    for (int k = 0; k < 100000; ++k)
      z = z + 1;
  }
}

// The step on another thread than main, i.e. on the kernels' pool (pool.h's run_shares).
void step_off_main(const std::vector<StepSpan>& spans, const std::vector<AdamConsts>& c,
                   int threads) {
  std::async(std::launch::async, [&] { ampactor::kernels::adam_step(spans, c, threads); }).get();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The fused step's pool beside LibTorch's spinning OpenMP workers"};
  int reps = 15;
  app.add_option("--reps", reps, "repetitions (medians)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const std::int64_t total = std::int64_t(16) << 20, per = total / 64;
  std::vector<std::vector<float>> p(64), m(64), v(64);
  std::vector<std::vector<std::uint16_t>> g(64), w(64);
  std::vector<StepSpan> spans;
  for (std::size_t i = 0; i < 64; ++i) {
    p[i].assign(std::size_t(per), 0.01f), m[i].assign(std::size_t(per), 0.0f);
    v[i].assign(std::size_t(per), 0.0f), g[i].assign(std::size_t(per), 0x3c00);
    w[i].assign(std::size_t(per), 0);
    StepSpan s;
    s.grad = g[i].data(), s.grad_type = StepElem::f16, s.param = p[i].data();
    s.m = m[i].data(), s.v = v[i].data(), s.weight = w[i].data();
    s.weight_type = StepElem::f16, s.n = per;
    spans.push_back(s);
  }
  AdamConsts c;
  c.inv = 1.0f / 1024, c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.999f, c.omb2 = 0.001f, c.eps = 1e-8f;
  c.sqrt_bc2 = float(std::sqrt(1 - 0.999)), c.neg_step = -1e-3f;
  const std::vector<AdamConsts> cs{c};

  std::cout
      << "fused Adam step, 16 Mi fp16 parameters, 64 tensors; ms per step, median of " << reps
      << "\n\nthreads | alone (pool) | after an OpenMP region (pool) | after one, on its team\n";
  auto med = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // (a) first, for both thread counts, before this process has run any OpenMP region (so no
  // OpenMP worker exists yet); then (b) and (c) in turn.
  std::vector<double> t[2][3];
  for (int threads : {1, 2})
    for (int r = 0; r < reps; ++r)
      t[threads - 1][0].push_back(timed([&] { step_off_main(spans, cs, threads); }));
  for (int threads : {1, 2}) {
    for (int r = 0; r < reps; ++r) {
      omp_region(2);
      t[threads - 1][1].push_back(timed([&] { step_off_main(spans, cs, threads); }));
      omp_region(2);
      t[threads - 1][2].push_back(timed([&] { ampactor::kernels::adam_step(spans, cs, threads); }));
    }
    std::cout << std::fixed << std::setprecision(2) << "      " << threads << " | " << std::setw(12)
              << med(t[threads - 1][0]) << " | " << std::setw(29) << med(t[threads - 1][1]) << " | "
              << std::setw(22) << med(t[threads - 1][2]) << "\n";
  }
}
