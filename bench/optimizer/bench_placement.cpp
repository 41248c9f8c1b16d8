// ampactor-bench-placement: how the fused Adam step's speed depends on where its five arrays lie
// relative to one another (master, exp_avg, exp_avg_sq: fp32; grad, weight: fp16). The ceiling is
// one read+write stream over the 28 bytes per parameter the step moves, which no placement
// affects. For each size: the arrays allocated one by one with exactly n elements, as a model
// and its optimizer allocate them, then at random page-aligned places in one mapping. Each
// repetition runs the step and the stream back to back; ratios are medians of per-repetition
// ratios. Torch-free.
#include <ampactor/kernels/fused_step.h>

#include <sys/mman.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <vector>

#include "bench_setup.h"
#include "bench_util.h"

using ampactor::bench::Clock;
using ampactor::bench::median_of;
namespace k = ampactor::kernels;

namespace {

double secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The step's time over the stream's, median of per-repetition ratios.
double step_over_stream(k::StepSpan s, std::vector<std::uint64_t>& words, int threads, int reps) {
  k::AdamConsts c;
  c.inv = 1.0f / 65536, c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.999f, c.omb2 = 0.001f;
  c.sqrt_bc2 = 0.5f, c.eps = 1e-8f, c.neg_step = -1e-3f;
  std::vector<double> ratios;
  for (int r = 0; r < reps + 1; ++r) {  // the first round touches every page
    auto t0 = Clock::now();
    k::adam_step({s}, {c}, threads);
    const double step = secs(t0);
    t0 = Clock::now();
#pragma omp parallel for num_threads(threads)
    for (std::int64_t i = 0; i < std::int64_t(words.size()); ++i)
      words[std::size_t(i)] ^= 0x8000000080000000ull;
    if (r > 0) ratios.push_back(step / secs(t0));
  }
  return median_of(ratios);
}

k::StepSpan span_of(void* p, void* m, void* v, void* g, void* w, std::int64_t n) {
  k::StepSpan s;
  s.param = static_cast<float*>(p), s.m = static_cast<float*>(m), s.v = static_cast<float*>(v);
  s.grad = g, s.grad_type = k::StepElem::f16, s.weight = w, s.weight_type = k::StepElem::f16;
  s.n = n;
  return s;
}

void fill(k::StepSpan s) {
  std::memset(s.m, 0, std::size_t(s.n) * 4);
  std::memset(s.v, 0, std::size_t(s.n) * 4);
  for (std::int64_t i = 0; i < s.n; ++i)
    s.param[i] = 0.1f, static_cast<std::uint16_t*>(const_cast<void*>(s.grad))[i] = 0x1c00;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The fused step's speed against where its arrays lie"};
  std::vector<double> mib = {8, 16, 32, 64};
  int placements = 8, reps = 9, threads = 1;
  unsigned seed = 1;
  std::string json_path;
  app.add_option("--mparams", mib, "parameter counts, in Mi")->check(CLI::PositiveNumber);
  app.add_option("--placements", placements, "random placements per size")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "repetitions (medians)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "threads of the step and the stream")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "the random placements' seed");
  app.add_option("--json", json_path, "write the figures here");
  CLI11_PARSE(app, argc, argv);
  std::mt19937 rng(seed);
  std::cout << "fused Adam step (" << k::fused_step_variant() << ", " << threads
            << " thread(s)) over a read+write stream of 28 B/param, median of " << reps << "\n";
  nlohmann::json rows = nlohmann::json::array();
  for (double m : mib) {
    const std::int64_t n = std::int64_t(m * (1 << 20)), b32 = n * 4, b16 = n * 2;
    std::vector<std::uint64_t> words(std::size_t(n * 14 / 8), 1);
    // One by one, exactly n elements each: the model's arrays, then the optimizer's state.
    double one_by_one = 0;
    {
      void* a[5];
      const std::int64_t bytes[5] = {b32, b16, b16, b32, b32};  // p, g, w, m, v
      for (int i = 0; i < 5; ++i)
        a[i] = std::aligned_alloc(64, std::size_t(bytes[i]));
      const k::StepSpan s = span_of(a[0], a[3], a[4], a[1], a[2], n);
      fill(s);
      one_by_one = step_over_stream(s, words, threads, reps);
      for (void* p : a)
        std::free(p);
    }
    // Random page-aligned gaps (up to 2 MiB) between the arrays in one mapping.
    std::vector<double> random;
    const std::size_t total = std::size_t(3 * b32 + 2 * b16 + 5 * (2 << 20) + 4096);
    for (int t = 0; t < placements; ++t) {
      void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) {
        std::cerr << "mmap of " << total << " bytes failed\n";
        return 1;
      }
      char* q = static_cast<char*>(base);
      auto take = [&](std::int64_t bytes) {
        q += std::uniform_int_distribution<int>(0, 511)(rng) * 4096;
        char* r = q;
        q += bytes;
        return r;
      };
      void* p = take(b32);
      void* mm = take(b32);
      void* v = take(b32);
      void* g = take(b16);
      void* w = take(b16);
      const k::StepSpan s = span_of(p, mm, v, g, w, n);
      fill(s);
      random.push_back(step_over_stream(s, words, threads, reps));
      munmap(base, total);
    }
    std::sort(random.begin(), random.end());
    std::cout << std::fixed << std::setprecision(3) << std::setw(6) << m
              << " Mi  one by one: " << one_by_one << "x";
    if (!random.empty())
      std::cout << "   random (" << placements << "): min " << random.front() << "x, median "
                << median_of(random) << "x, max " << random.back() << "x";
    std::cout << std::endl;
    rows.push_back({{"mparams", m}, {"one_by_one", one_by_one}, {"random", random}});
  }
  if (!json_path.empty())
    std::ofstream(json_path) << nlohmann::json({{"threads", threads},
                                                {"rows", rows},
                                                {"setup", ampactor::bench::run_setup()}})
                                    .dump(1)
                             << "\n";
}
