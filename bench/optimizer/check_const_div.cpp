// ampactor-check-const-div: the fused Adam loops' division by the constant sqrt(bias_correction2)
// (a multiply and two FMAs, kernels/cpu/optim_impl.h's div_by) against the division, for every
// float a that sqrt can give (NaN, +-0, [2^-75, 2^64], +inf: all 2^32 patterns, filtered) and
// many divisors c: the sqrt_bc2 of common betas and steps, the ends of the valid range, and
// random c log-uniform over it. Prints the mismatches; exits 1 if there is any.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "cpu_features.h"
#include "optim_loops.h"

namespace cpu = ampactor::kernels::cpu;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The patterns sqrt can give, as half-open ranges of bits: +0, -0, [2^-76, 2^65] (sqrt gives no
// subnormal and nothing beyond 2^64), +inf and the positive NaNs, the negative NaNs.
const std::uint64_t kRanges[][2] = {{0, 1},
                                    {0x80000000u, 0x80000001u},
                                    {bits_of(0x1p-76f), std::uint64_t(bits_of(0x1p65f)) + 1},
                                    {0x7f800000u, 0x80000000u},
                                    {0xff800001u, std::uint64_t(1) << 32}};

// Mismatches of t.const_div over every pattern in sqrt's range, for divisor c.
std::uint64_t sweep(const cpu::OptimLoopTable& t, float c) {
  constexpr std::uint64_t kChunk = std::uint64_t(1) << 20;
  std::vector<float> a(kChunk), got(kChunk), want(kChunk);
  std::uint64_t wrong = 0;
  for (const auto& r : kRanges) {
    for (std::uint64_t lo = r[0]; lo < r[1]; lo += kChunk) {
      const std::size_t n = std::size_t(std::min(kChunk, r[1] - lo));
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t u = std::uint32_t(lo + i);
        std::memcpy(&a[i], &u, 4);
      }
      t.const_div(a.data(), got.data(), std::int64_t(n), c);
      for (std::size_t i = 0; i < n; ++i)
        want[i] = a[i] / c;
      if (std::memcmp(want.data(), got.data(), n * 4) == 0) continue;
      for (std::size_t i = 0; i < n; ++i) {
        if (std::memcmp(&want[i], &got[i], 4) != 0) {
          if (wrong < 5)
            std::cout << "  mismatch: a " << a[i] << " / c " << c << ": " << got[i] << ", want "
                      << want[i] << "\n";
          ++wrong;
        }
      }
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sweeps the fused Adam loops' division by sqrt_bc2 against the division"};
  int random_cs = 32;
  unsigned seed = 1;
  app.add_option("--random", random_cs, "random divisors, log-uniform over [2^-27, 1]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "their seed");
  CLI11_PARSE(app, argc, argv);

  std::vector<float> cs;
  for (double beta2 : {0.999, 0.99, 0.95, 0.9})
    for (int step : {1, 2, 3, 5, 10, 100, 1000, 10000})
      cs.push_back(float(std::sqrt(1 - std::pow(beta2, step))));
  cs.insert(cs.end(), {float(std::sqrt(0x1p-53)), 0x1p-27f, 1.0f, std::nextafter(1.0f, 0.0f)});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log2c(-27.0, 0.0);
  for (int k = 0; k < random_cs; ++k)
    cs.push_back(float(std::exp2(log2c(rng))));

  std::vector<const cpu::OptimLoopTable*> tables;
  if (cpu::has_avx2_f16c_fma()) tables.push_back(&cpu::avx2_optim_loops());
  if (cpu::has_avx512()) tables.push_back(&cpu::avx512_optim_loops());
  if (tables.empty()) {
    std::cout << "no AVX2 or AVX-512 loops on this CPU: the baseline divides; nothing to check\n";
    return 0;
  }
  std::uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const cpu::OptimLoopTable* t : tables) {
    for (std::size_t k = 0; k < cs.size(); ++k) {
      const std::uint64_t wrong = sweep(*t, cs[k]);
      total += wrong;
      std::cout << t->name << " c " << cs[k] << ": " << wrong << " mismatches (" << k + 1 << "/"
                << cs.size() << ", "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                << " s)\n"
                << std::flush;
    }
  }
  std::cout << (total == 0 ? "no mismatch" : "MISMATCHES") << " in " << tables.size() << " x "
            << cs.size() << " divisors, every a in sqrt's range\n";
  return total == 0 ? 0 : 1;
}
