// Out-of-place steps (StepSpan::param_out, m_out, v_out, vmax_out): the speculative step of the
// overlapped-backward pipeline writes the new master and state into a second buffer and only
// reads the live ones. It must give the in-place step's bits, leave its inputs untouched, and
// stay within the span, in every loop variant, with every gradient and weight type, also when
// inf and NaN reach the arrays.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optim_tables.h"

#include <ampactor/kernels/fused_step.h>

using ampactor::kernels::AdamConsts;
using ampactor::kernels::SgdConsts;
using ampactor::kernels::StepElem;
using ampactor::kernels::StepSpan;
using ampactor::kernels::cpu::OptimLoopTable;

namespace {

struct State {
  std::vector<float> p, m, v, vmax;
  std::vector<std::uint16_t> weight;  // 16-bit weights (f16 or bf16 bits); f32 uses `weight32`
  std::vector<float> weight32;
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// n elements of random state; the gradient as fp32 values poisoned with inf/NaN where asked.
State random_state(std::int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  for (std::int64_t i = 0; i < n; ++i) {
    s.p.push_back(normal(rng) * 0.1f);
    s.m.push_back(normal(rng) * 1e-3f);
    s.v.push_back(std::abs(normal(rng)) * 1e-6f);
    s.vmax.push_back(std::abs(normal(rng)) * 1e-6f);
  }
  s.weight.assign(std::size_t(n), 0);
  s.weight32.assign(std::size_t(n), 0);
  return s;
}

// Gradient bits of `t` for n elements: small finite values, and inf/NaN when poisoned.
std::vector<std::uint8_t> grads_of(StepElem t, std::int64_t n, bool poison, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t eb = t == StepElem::f32 ? 4 : 2;
  std::vector<std::uint8_t> out(std::size_t(n) * eb);
  for (std::int64_t i = 0; i < n; ++i) {
    float x = normal(rng) * 0.5f;
    if (poison && i == n / 3) x = NAN;
    if (poison && i == n / 2) x = INFINITY;
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (t == StepElem::f32) {
      std::memcpy(&out[std::size_t(i) * 4], &bits, 4);
    } else if (t == StepElem::bf16) {
      const std::uint16_t h = std::uint16_t(bits >> 16);
      std::memcpy(&out[std::size_t(i) * 2], &h, 2);
    } else {  // fp16 of 0.5 * N(0, 1): sign, a small exponent, the top mantissa bits
      std::uint16_t h = std::uint16_t((bits >> 16) & 0x8000u) |
                        std::uint16_t((12u + (bits >> 23) % 4u) << 10) |
                        std::uint16_t((bits >> 13) & 0x3ffu);
      if (std::isnan(x)) h = 0x7e00;
      if (std::isinf(x)) h = 0x7c00;
      std::memcpy(&out[std::size_t(i) * 2], &h, 2);
    }
  }
  return out;
}

StepSpan span_over(State& s, const std::vector<std::uint8_t>& grad, StepElem g, StepElem w) {
  StepSpan sp;
  sp.grad = grad.data(), sp.grad_type = g, sp.n = std::int64_t(s.p.size());
  sp.param = s.p.data(), sp.m = s.m.data(), sp.v = s.v.data(), sp.vmax = s.vmax.data();
  sp.weight = w == StepElem::f32 ? static_cast<void*>(s.weight32.data()) : s.weight.data();
  sp.weight_type = w;
  return sp;
}

// Runs `step` (which may clear the span's arrays it does not use) in place on one copy of the state
// and out of place on another (outputs in fresh arrays, filled with a pattern), and compares: the
// outputs equal the in-place results, the inputs equal the state before, and the outputs outside
// [b, e) keep their pattern.
template <typename Step>
void compare(const OptimLoopTable& t, StepElem g, StepElem w, bool poison, bool flag, Step step) {
  for (std::int64_t n : {1, 7, 31, 200, 1037}) {
    std::mt19937 rng(std::uint32_t(n * 31 + int(g) * 7 + int(w) + poison));
    const State init = random_state(n, rng);
    const std::vector<std::uint8_t> grad = grads_of(g, n, poison, rng);
    const std::int64_t b = n > 10 ? 3 : 0, e = n > 10 ? n - 2 : n;
    State in_place = init;
    StepSpan ip = span_over(in_place, grad, g, w);
    step(t, flag, ip, b, e);
    State live = init;
    const float pattern = -12345.0f;
    std::vector<float> po(std::size_t(n), pattern), mo = po, vo = po, vmaxo = po;
    StepSpan sp = span_over(live, grad, g, w);
    sp.param_out = po.data(), sp.m_out = mo.data(), sp.v_out = vo.data();
    sp.vmax_out = vmaxo.data();
    step(t, flag, sp, b, e);
    CAPTURE(std::string(t.name));
    CAPTURE(n);
    CAPTURE(int(g));
    CAPTURE(int(w));
    CAPTURE(poison);
    CAPTURE(flag);
    // The live arrays were only read.
    CHECK(same(live.p, init.p));
    CHECK(same(live.m, init.m));
    CHECK(same(live.v, init.v));
    CHECK(same(live.vmax, init.vmax));
    // Inside [b, e) the outputs hold the in-place step; outside it, the pattern.
    auto expect = [&](const std::vector<float>& stepped, const std::vector<float>& out,
                      bool written) {
      std::vector<float> want(std::size_t(n), pattern);
      if (written)
        for (std::int64_t i = b; i < e; ++i)
          want[std::size_t(i)] = stepped[std::size_t(i)];
      CHECK(same(out, want));
    };
    expect(in_place.p, po, true);
    expect(in_place.m, mo, sp.m != nullptr);
    expect(in_place.v, vo, sp.v != nullptr);
    expect(in_place.vmax, vmaxo, sp.vmax != nullptr);
    CHECK(live.weight == in_place.weight);
    CHECK(same(live.weight32, in_place.weight32));
  }
}

template <typename Step>
void every_case(Step step) {
  const std::pair<StepElem, StepElem> types[] = {{StepElem::f16, StepElem::f16},
                                                 {StepElem::bf16, StepElem::bf16},
                                                 {StepElem::f32, StepElem::f32},
                                                 {StepElem::f16, StepElem::f32}};
  for (const OptimLoopTable* t : optim_tables())
    for (auto [g, w] : types)
      for (bool poison : {false, true})
        for (bool flag : {false, true})
          compare(*t, g, w, poison, flag, step);
}

}  // namespace

TEST_CASE("out-of-place Adam steps write the in-place step's bits and only read the live state") {
  every_case(
      [](const OptimLoopTable& t, bool amsgrad, StepSpan& s, std::int64_t b, std::int64_t e) {
        AdamConsts k;
        k.inv = 1.0f / 1024, k.b1 = 0.9f, k.omb1 = float(1 - 0.9), k.b2 = 0.999f;
        k.omb2 = float(1 - 0.999), k.eps = 1e-8f, k.sqrt_bc2 = 0.5f, k.neg_step = -1e-3f;
        k.decoupled = amsgrad, k.decay = 0.99f;  // AdamW's decay with amsgrad, to cover both
        k.l2 = !amsgrad, k.wd = 1e-2f;
        k.reciprocal = amsgrad;  // both ways of dividing by sqrt_bc2
        if (!amsgrad) s.vmax = nullptr;
        t.adam(s, k, b, e);
      });
}

TEST_CASE("out-of-place SGD steps write the in-place step's bits and only read the live state") {
  every_case(
      [](const OptimLoopTable& t, bool nesterov, StepSpan& s, std::int64_t b, std::int64_t e) {
        SgdConsts k;
        k.inv = 1.0f / 1024, k.momentum = 0.9f, k.omdamp = 0.75f, k.neg_lr = -0.1f;
        k.nesterov = nesterov, k.l2 = true, k.wd = 1e-4f;
        s.v = s.vmax = nullptr;
        t.sgd(s, k, b, e);
      });
}
