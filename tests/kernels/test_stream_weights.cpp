// Beyond the last-level cache the fused steps write the model's weights with non-temporal
// stores (AdamConsts/SgdConsts::stream_weight), which need aligned addresses: the loops step the
// first elements one by one up to an aligned one. Whatever the alignment, the range or the types,
// streaming must give the same bits as plain stores and touch nothing outside [begin, end).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
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

std::int64_t bytes_of(StepElem t) {
  return t == StepElem::f32 ? 4 : 2;
}

// Finite random values of type t (raw bits), with one NaN and one inf among them.
std::vector<std::uint8_t> random_grads(StepElem t, std::int64_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> out(std::size_t(n * bytes_of(t)));
  std::uniform_int_distribution<std::uint32_t> bits;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t r = bits(rng), sign = r & 0x80000000u;
    if (t == StepElem::f32) {  // exponents 2^-10 .. 2^9
      const std::uint32_t f = sign | ((117u + r % 20u) << 23) | (r >> 9 & 0x7fffffu);
      std::memcpy(&out[std::size_t(i * 4)], &f, 4);
    } else {
      const std::uint16_t exp =
          t == StepElem::f16 ? std::uint16_t(5 + r % 25) << 10 : std::uint16_t(117 + r % 20) << 7;
      const std::uint16_t mant = std::uint16_t(r >> 8) & (t == StepElem::f16 ? 0x3ffu : 0x7fu);
      const std::uint16_t h = std::uint16_t(sign >> 16) | exp | mant;
      std::memcpy(&out[std::size_t(i * 2)], &h, 2);
    }
  }
  // A NaN and an inf reach the arrays as any value does (the skip is decided before the loops).
  const bool wide = t == StepElem::f32;
  const std::uint32_t nan = wide ? 0x7fc00000u : t == StepElem::f16 ? 0x7e00u : 0x7fc0u;
  const std::uint32_t inf = wide ? 0x7f800000u : t == StepElem::f16 ? 0x7c00u : 0x7f80u;
  const auto put = [&](std::int64_t i, std::uint32_t w) {
    const std::uint16_t h = std::uint16_t(w);
    if (wide)
      std::memcpy(&out[std::size_t(i * 4)], &w, 4);
    else
      std::memcpy(&out[std::size_t(i * 2)], &h, 2);
  };
  put(n / 3, nan);
  put(n / 2, inf);
  return out;
}

struct Arrays {
  std::vector<float> p, m, v, vmax;
  std::vector<std::uint8_t> weight;  // `pad` elements either side of the span's
};

constexpr std::int64_t kPad = 24;

struct Case {
  StepElem grad, weight;
  std::int64_t misalign;  // elements from an aligned allocation to the span's weight
  std::int64_t begin, end_gap, n;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<StepElem, StepElem> types[] = {{StepElem::f16, StepElem::f16},
                                                 {StepElem::bf16, StepElem::bf16},
                                                 {StepElem::f32, StepElem::f32},
                                                 {StepElem::f16, StepElem::f32},
                                                 {StepElem::f32, StepElem::bf16}};
  for (auto [g, w] : types)
    for (std::int64_t mis : {0, 1, 7, 15, 17, 31})
      for (std::int64_t begin : {0, 3, 16})
        for (std::int64_t n : {1037 + 256, 200})  // 200: too short to stream
          out.push_back({g, w, mis, begin, begin == 3 ? 5 : 0, n});
  return out;
}

// Runs `step` over a fresh copy of the same inputs with stream_weight off (k = 0) and on (k = 1).
template <typename Step>
void compare(const Case& c, Step step) {
  std::mt19937 rng(std::uint32_t(c.n + c.misalign * 7 + c.begin));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<std::uint8_t> grad = random_grads(c.grad, c.n, rng);
  Arrays init;
  for (std::int64_t i = 0; i < c.n; ++i) {
    init.p.push_back(normal(rng) * 0.1f);
    init.m.push_back(normal(rng) * 1e-3f);
    init.v.push_back(std::abs(normal(rng)) * 1e-6f);
    init.vmax.push_back(std::abs(normal(rng)) * 1e-6f);
  }
  const std::int64_t wb = bytes_of(c.weight);
  // 64-byte aligned storage, so that `misalign` sets the span's alignment exactly.
  std::vector<std::uint64_t> store[2];
  const std::uint8_t* base[2] = {};
  Arrays out[2];
  for (int k = 0; k < 2; ++k) {
    out[k] = init;
    store[k].assign(std::size_t((c.n + 2 * kPad + 64) * wb / 8 + 16), 0xa5a5a5a5a5a5a5a5ull);
    auto* b = reinterpret_cast<std::uint8_t*>(store[k].data());
    b += (64 - reinterpret_cast<std::uintptr_t>(b) % 64) % 64;
    base[k] = b;
    StepSpan s;
    s.grad = grad.data(), s.grad_type = c.grad, s.n = c.n;
    s.param = out[k].p.data(), s.m = out[k].m.data(), s.v = out[k].v.data();
    s.vmax = out[k].vmax.data();
    s.weight = b + (kPad + c.misalign) * wb, s.weight_type = c.weight;
    step(s, c.begin, c.n - c.end_gap, k == 1);
  }
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  CHECK(same(out[0].p, out[1].p));
  CHECK(same(out[0].m, out[1].m));
  CHECK(same(out[0].v, out[1].v));
  CHECK(same(out[0].vmax, out[1].vmax));
  const std::int64_t span_bytes = (c.n + 2 * kPad + 16) * wb;
  CHECK(std::memcmp(base[0], base[1], std::size_t(span_bytes)) == 0);
  // Outside [begin, end) the weights keep the fill pattern.
  const std::uint8_t* w = base[1];
  const std::int64_t lo = (kPad + c.misalign + c.begin) * wb,
                     hi = (kPad + c.misalign + c.n - c.end_gap) * wb;
  std::int64_t touched_outside = 0, written_inside = 0;
  for (std::int64_t b = 0; b < span_bytes; ++b) {
    const bool fill = w[b] == 0xa5;
    if (b < lo || b >= hi)
      touched_outside += !fill;
    else
      written_inside += !fill;
  }
  CHECK(touched_outside == 0);
  CHECK(written_inside > (hi - lo) / 2);  // the range was written at all
}

// Every loop variant, case and option flag (amsgrad, nesterov), its capture in scope, through
// step(table, case, flag, span, begin, end, stream).
template <typename Step>
void for_each_case(Step step) {
  for (const OptimLoopTable* t : optim_tables())
    for (const Case& c : cases())
      for (bool flag : {false, true}) {
        const std::string name = t->name;
        CAPTURE(name);
        CAPTURE(int(c.grad));
        CAPTURE(int(c.weight));
        CAPTURE(c.misalign);
        CAPTURE(c.begin);
        CAPTURE(c.n);
        CAPTURE(flag);
        compare(c, [&](StepSpan s, std::int64_t b, std::int64_t e, bool stream) {
          step(*t, flag, s, b, e, stream);
        });
      }
}

}  // namespace

TEST_CASE("streamed weights: the Adam loops give plain stores' bits and stay in their range") {
  for_each_case([](const OptimLoopTable& t, bool amsgrad, StepSpan s, std::int64_t b,
                   std::int64_t e, bool stream) {
    AdamConsts k;
    k.inv = 1.0f / 1024, k.b1 = 0.9f, k.omb1 = float(1 - 0.9), k.b2 = 0.999f;
    k.omb2 = float(1 - 0.999), k.eps = 1e-8f, k.sqrt_bc2 = 0.5f, k.neg_step = -1e-3f;
    k.decoupled = amsgrad, k.decay = 0.99f;  // AdamW's decay with amsgrad, to cover both
    k.stream_weight = stream;
    if (!amsgrad) s.vmax = nullptr;
    t.adam(s, k, b, e);
  });
}

TEST_CASE("streamed weights: the SGD loops give plain stores' bits and stay in their range") {
  for_each_case([](const OptimLoopTable& t, bool nesterov, StepSpan s, std::int64_t b,
                   std::int64_t e, bool stream) {
    SgdConsts k;
    k.inv = 1.0f / 1024, k.momentum = 0.9f, k.omdamp = 1, k.neg_lr = -0.1f;
    k.nesterov = nesterov, k.l2 = true, k.wd = 1e-4f;
    k.stream_weight = stream;
    s.v = s.vmax = nullptr;
    t.sgd(s, k, b, e);
  });
}

TEST_CASE("streaming is on unless AMPACTOR_STREAM_WEIGHTS=0, and set_stream_weights switches it") {
  namespace k = ampactor::kernels;
  const char* env = std::getenv("AMPACTOR_STREAM_WEIGHTS");
  const bool before = k::stream_weights();
  CHECK(before == (env == nullptr || std::string(env) != "0"));
  k::set_stream_weights(false);
  CHECK_FALSE(k::stream_weights());
  k::set_stream_weights(true);
  CHECK(k::stream_weights());
  k::set_stream_weights(before);
}
