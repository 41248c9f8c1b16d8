// The fused Adam loops divide by the constant sqrt(bias_correction2) with a multiply and two FMAs
// (optim_impl.h's div_by), which must give the division's bits for every value sqrt can give.
// bench/check_const_div.cpp sweeps all 2^32 patterns; this sweeps a strided sample, a whole
// binade and the edges, for every variant the CPU runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "optim_loops.h"

using ampactor::kernels::cpu::OptimLoopTable;

namespace {

std::vector<const OptimLoopTable*> optim_tables() {
  namespace cpu = ampactor::kernels::cpu;
  std::vector<const OptimLoopTable*> out{&cpu::baseline_optim_loops()};
  if (cpu::has_avx2_f16c_fma())
    out.push_back(&cpu::avx2_optim_loops());
  else
    MESSAGE("this CPU has no AVX2/F16C/FMA: the AVX2 loops are not tested");
  if (cpu::has_avx512())
    out.push_back(&cpu::avx512_optim_loops());
  else
    MESSAGE("this CPU has no AVX-512 F/BW/VL/DQ: the AVX-512 loops are not tested");
  return out;
}

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Every value the loops divide: sqrt of a strided sweep of all 2^32 patterns (NaNs with their
// payloads, infinities, subnormals and negatives included), all of [1, 2), and the edges.
std::vector<float> sqrt_values() {
  std::vector<float> a;
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 4099)
    a.push_back(std::sqrt(from_bits(std::uint32_t(b))));
  for (std::uint32_t b = bits_of(1.0f); b < bits_of(2.0f); ++b)
    a.push_back(from_bits(b));
  const float lim[] = {0.0f,
                       -0.0f,
                       std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(),
                       from_bits(0x7fc12345u),
                       std::sqrt(std::numeric_limits<float>::denorm_min()),
                       std::sqrt(std::numeric_limits<float>::min()),
                       std::sqrt(std::numeric_limits<float>::max())};
  a.insert(a.end(), std::begin(lim), std::end(lim));
  a.push_back(1.5f);  // an odd length, so that the 8-lane and scalar tails run too
  return a;
}

// sqrt_bc2 as FusedAdam computes it: float(sqrt(1 - beta2^step)).
float sqrt_bc2(double beta2, int step) {
  return float(std::sqrt(1 - std::pow(beta2, step)));
}

}  // namespace

TEST_CASE("the Adam loops' division by sqrt_bc2 gives the division's bits for every sqrt") {
  std::vector<float> cs = {sqrt_bc2(0.999, 1),        sqrt_bc2(0.999, 2),        sqrt_bc2(0.999, 3),
                           sqrt_bc2(0.999, 10),       sqrt_bc2(0.999, 1000),     sqrt_bc2(0.95, 1),
                           sqrt_bc2(0.0, 1),          float(std::sqrt(0x1p-53)), 0x1p-27f,
                           std::nextafter(1.0f, 0.0f)};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log2c(-27.0, 0.0);
  for (int k = 0; k < 4; ++k)
    cs.push_back(float(std::exp2(log2c(rng))));
  // Outside the range where the multiply may stand in (a param group's own unchecked betas).
  cs.insert(cs.end(), {0x1p-30f, 2.0f, 0.0f, -0.5f});

  const std::vector<float> a = sqrt_values();
  std::vector<float> got(a.size());
  for (const OptimLoopTable* t : optim_tables()) {
    for (float c : cs) {
      const std::string name = t->name;
      CAPTURE(name);
      CAPTURE(c);
      t->const_div(a.data(), got.data(), std::int64_t(a.size()), c);
      std::size_t wrong = 0, first = a.size();
      for (std::size_t i = 0; i < a.size(); ++i)
        if (bits_of(got[i]) != bits_of(a[i] / c)) {
          ++wrong;
          if (first == a.size()) first = i;
        }
      CAPTURE(first < a.size() ? a[first] : 0.0f);
      CHECK(wrong == 0);
    }
  }
}
