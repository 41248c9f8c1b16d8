// The fused Adam loops divide by the constant sqrt(bias_correction2) with a multiply and two FMAs
// (optim_impl.h's div_by), which must give the division's bits for every value sqrt can give.
// bench/optimizer/check_const_div.cpp sweeps all 2^32 patterns; this sweeps a strided sample, a
// whole binade and the edges, for every variant the CPU runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim_tables.h"

#include <ampactor/kernels/fused_step.h>

using ampactor::kernels::cpu::OptimLoopTable;

namespace {

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

TEST_CASE("the Adam loops give the same bits through the reciprocal as through the divide") {
  using ampactor::kernels::AdamConsts;
  using ampactor::kernels::StepElem;
  using ampactor::kernels::StepSpan;
  const std::int64_t n = 1037;  // 16-lane body, an 8-lane vector and a scalar tail
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> grad(n), p0(n), m0(n), v0(n), vmax0(n);
  for (std::int64_t i = 0; i < n; ++i) {
    grad[std::size_t(i)] = normal(rng) * 64;
    p0[std::size_t(i)] = normal(rng) * 0.1f;
    m0[std::size_t(i)] = normal(rng) * 1e-3f;
    v0[std::size_t(i)] = std::abs(normal(rng)) * 1e-6f;
    vmax0[std::size_t(i)] = std::abs(normal(rng)) * 1e-6f;
  }
  // The edges of what sqrt is given: zeros, a huge v (its sqrt near 2^64), inf and NaN.
  v0[3] = 0, v0[20] = -0.0f, v0[40] = std::numeric_limits<float>::max();
  v0[77] = std::numeric_limits<float>::infinity(), v0[100] = std::nanf("");
  v0[n - 2] = std::numeric_limits<float>::infinity(), v0[n - 1] = 0;
  for (const OptimLoopTable* t : optim_tables()) {
    for (int step : {1, 2, 1000}) {
      for (bool amsgrad : {false, true}) {
        AdamConsts c;
        c.inv = 1.0f / 1024, c.b1 = 0.9f, c.omb1 = float(1 - 0.9), c.b2 = 0.999f;
        c.omb2 = float(1 - 0.999), c.eps = 1e-8f, c.sqrt_bc2 = sqrt_bc2(0.999, step);
        c.neg_step = float(-(1e-3 / (1 - std::pow(0.9, step))));
        std::vector<float> out[2][4];  // p, m, v, vmax for divide and reciprocal
        for (int r = 0; r < 2; ++r) {
          out[r][0] = p0, out[r][1] = m0, out[r][2] = v0, out[r][3] = vmax0;
          StepSpan s;
          s.grad = grad.data(), s.grad_type = StepElem::f32, s.n = n;
          s.param = out[r][0].data(), s.m = out[r][1].data(), s.v = out[r][2].data();
          s.vmax = amsgrad ? out[r][3].data() : nullptr;
          c.reciprocal = r == 1;
          t->adam(s, c, 0, n);
        }
        const std::string name = t->name;
        CAPTURE(name);
        CAPTURE(step);
        CAPTURE(amsgrad);
        for (int k = 0; k < 4; ++k)
          CHECK(std::memcmp(out[0][k].data(), out[1][k].data(), std::size_t(n) * 4) == 0);
        CHECK(std::isnan(out[1][0][100]));  // the NaN in v reached p
      }
    }
  }
}
