// The fused optimizer steps' loop bodies, shared by every instruction-set variant (included by one
// .cpp per variant, as loops_impl.h). Each element follows torch::optim's sequence of ATen ops
// exactly: the AVX2 variant fuses the multiply-adds that ATen's AVX2/AVX-512 kernels fuse
// (add with alpha, addcmul), the baseline fuses none, as ATen's default kernels; sqrt and the
// divisions are correctly rounded in all (the division by the constant sqrt_bc2 without a divide
// instruction in the vector loops, see div_by). The AVX-512 variant runs the AVX2 variant's
// operations 16 lanes at a time: every element gets the same operations, so the same bits.
// Compiled with -ffp-contract=off so that no other expression is fused behind our back.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AMPACTOR_HAVE_F16C 1
#endif

#include "optim_loops.h"

namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS {
namespace {

#include "loops_bits.h"

// The vector helpers, which use loops_bits.h:
#include "loops_avx512.h"
#include "loops_f16c.h"

#ifdef AMPACTOR_HAVE_F16C
inline float madd(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);  // one vfmadd with -mfma
}
#else
inline float madd(float a, float b, float c) {
  return a * b + c;
}
#endif

// What the weight write does: nothing (the master is the model's parameter) or a cast.
enum class Out : std::uint8_t { none, f32, f16, bf16 };

template <StepElem G>
inline float load1(const void* p, std::int64_t i) {
  if constexpr (G == StepElem::f32) return static_cast<const float*>(p)[i];
  if constexpr (G == StepElem::f16) return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  if constexpr (G == StepElem::bf16) return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
}
template <Out W>
inline void store1(void* p, std::int64_t i, float x) {
  if constexpr (W == Out::f32) static_cast<float*>(p)[i] = x;
  if constexpr (W == Out::f16) static_cast<std::uint16_t*>(p)[i] = float_to_half(x);
  if constexpr (W == Out::bf16) static_cast<std::uint16_t*>(p)[i] = float_to_bf16(x);
}

#include "optim_vec.h"

// Where a step writes: its outputs, or over its inputs (in place) where a span has none.
struct Dest {
  float *p, *m, *v, *vmax;
};
inline Dest dest_of(const StepSpan& s) {
  return {s.param_out ? s.param_out : s.param, s.m_out ? s.m_out : s.m, s.v_out ? s.v_out : s.v,
          s.vmax_out ? s.vmax_out : s.vmax};
}

// Where the division by sqrt_bc2 may be the multiply below: every valid beta2 (0 <= beta2 < 1 in
// double) gives sqrt_bc2 in [2^-26.5, 1]; other values (a param group's own unchecked betas)
// divide.
inline bool recip_ok(float sqrt_bc2) {
  return sqrt_bc2 >= 0x1p-27f && sqrt_bc2 <= 1.0f;
}

// RN(a / c) without a division, for every a that sqrt gives (NaN, +-0, [2^-75, 2^64], +inf) and c
// in recip_ok's range, given y = RN(1 / c): q = RN(a * y) is within an ulp of a / c, so
// r = q * c - a is exact in one FMA and RN(q - r * y) is RN(a / c) (Markstein's theorem; nothing
// in between under- or overflows for these a and c). Zeros keep their sign through fmsub and
// fnmadd; +inf would give NaN there, so it takes q (inf, as the division). The table's const_div
// runs exactly this, so that tests sweep it against the division.
template <typename T>
inline typename T::V div_by(typename T::V a, typename T::V c, typename T::V y, typename T::V inf) {
  const typename T::V q = T::mul(a, y);
  return T::select_eq(a, inf, q, T::fnmadd(T::fmsub(q, c, a), y, q));
}

// Runs body (which steps kLanes elements and returns the new masters) over [i, end) a vector at a
// time and writes the weights; returns where it stopped. Streamed 16-bit weights go a cache line
// (two 16-lane vectors) at a time.
template <typename T, Out W, typename Body>
std::int64_t vec_loop(void* w, std::int64_t i, std::int64_t end, bool nt, Body body) {
  if constexpr (T::kLanes == 16 && (W == Out::f16 || W == Out::bf16))
    for (; nt && i + 32 <= end; i += 32) {
      const typename T::V x0 = body(i), x1 = body(i + 16);
      T::template stream_pair<W>(w, i, x0, x1);
    }
  for (; i + T::kLanes <= end; i += T::kLanes)
    T::template store_weight<W>(w, i, body(i), nt);
  return i;
}

// The Adam loop's vector body; returns where it stopped.
template <typename T, StepElem G, Out W>
std::int64_t adam_vec(const StepSpan& s, const AdamConsts& c, std::int64_t i, std::int64_t end,
                      bool nt) {
  using V = typename T::V;
  const float* p = s.param;
  const float* m = s.m;
  const float* v = s.v;
  const float* vmax = s.vmax;
  const Dest o = dest_of(s);
  const bool recip = c.reciprocal && recip_ok(c.sqrt_bc2);
  const V inv = T::set1(c.inv), wd = T::set1(c.wd), decay = T::set1(c.decay), b1 = T::set1(c.b1),
          omb1 = T::set1(c.omb1), b2 = T::set1(c.b2), omb2 = T::set1(c.omb2),
          sbc2 = T::set1(c.sqrt_bc2), rbc2 = T::set1(1.0f / c.sqrt_bc2),
          inf = T::set1(__builtin_inff()), eps = T::set1(c.eps), neg = T::set1(c.neg_step);
  auto body = [&](std::int64_t j) {  // steps lanes [j, j + kLanes); returns the new p
    V g = T::mul(T::template load_grad<G>(s.grad, j), inv);
    V x = T::load(p + j);
    if (c.l2) g = T::fmadd(x, wd, g);
    if (c.decoupled) x = T::mul(x, decay);
    const V mi = T::fmadd(g, omb1, T::mul(T::load(m + j), b1));
    V vi = T::fmadd(T::mul(omb2, g), g, T::mul(T::load(v + j), b2));
    T::store(o.m + j, mi);
    T::store(o.v + j, vi);
    if (vmax) {
      vi = T::max_nan(vi, T::load(vmax + j));
      T::store(o.vmax + j, vi);
    }
    const V a = T::sqrt(vi);
    const V d = T::add(recip ? div_by<T>(a, sbc2, rbc2, inf) : T::div(a, sbc2), eps);
    x = T::add(x, T::div(T::mul(neg, mi), d));
    T::store(o.p + j, x);
    return x;
  };
  return vec_loop<T, W>(s.weight, i, end, nt, body);
}

// The SGD loop's vector body; returns where it stopped.
template <typename T, StepElem G, Out W>
std::int64_t sgd_vec(const StepSpan& s, const SgdConsts& c, std::int64_t i, std::int64_t end,
                     bool nt) {
  using V = typename T::V;
  const float* p = s.param;
  const float* m = s.m;
  const Dest o = dest_of(s);
  const V inv = T::set1(c.inv), wd = T::set1(c.wd), mom = T::set1(c.momentum),
          omd = T::set1(c.omdamp), neg = T::set1(c.neg_lr);
  auto body = [&](std::int64_t j) {
    V d = T::mul(T::template load_grad<G>(s.grad, j), inv);
    V x = T::load(p + j);
    if (c.l2) d = T::fmadd(x, wd, d);
    if (m) {
      const V b = c.first ? d : T::fmadd(d, omd, T::mul(T::load(m + j), mom));
      T::store(o.m + j, b);
      d = c.nesterov ? T::fmadd(b, mom, d) : b;
    }
    x = T::fmadd(d, neg, x);
    T::store(o.p + j, x);
    return x;
  };
  return vec_loop<T, W>(s.weight, i, end, nt, body);
}

// Where the vector loops start when the weights are streamed (stream_weight): the first element
// from i whose weight address is a multiple of the widest vector store, so that every
// non-temporal store is aligned; the elements before it take the scalar loop. -1: no streaming
// (not asked for, no vector loop, no weight, or too few elements to be worth it).
#if defined(AMPACTOR_HAVE_AVX512)
constexpr std::uintptr_t kWidest = 16;  // lanes of the widest vector loop (0: none)
#elif defined(AMPACTOR_HAVE_F16C)
constexpr std::uintptr_t kWidest = 8;
#else
constexpr std::uintptr_t kWidest = 0;
#endif
template <Out W>
std::int64_t nt_start(const void* w, bool asked, std::int64_t i, std::int64_t end) {
  // A cache line with AVX-512 (whole lines, see vec_loop), else one vector's weights.
  constexpr std::uintptr_t elem = W == Out::f32 ? 4 : 2, width = kWidest == 16 ? 64
                                                                 : kWidest     ? kWidest * elem
                                                                               : 1;
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(w) + std::uintptr_t(i) * elem;
  if (W == Out::none || kWidest == 0 || !asked || a % elem != 0 || end - i < 256) return -1;
  return i + std::int64_t((width - a % width) % width / elem);
}

template <StepElem G, Out W>
void adam_scalar(const StepSpan& s, const AdamConsts& c, std::int64_t i, std::int64_t end) {
  const float* p = s.param;
  const float* m = s.m;
  const float* v = s.v;
  const float* vmax = s.vmax;
  const Dest o = dest_of(s);
  for (; i < end; ++i) {
    float g = load1<G>(s.grad, i) * c.inv;
    float x = p[i];
    if (c.l2) g = madd(x, c.wd, g);
    if (c.decoupled) x = x * c.decay;
    const float mi = madd(g, c.omb1, m[i] * c.b1);
    float vi = madd(c.omb2 * g, g, v[i] * c.b2);
    o.m[i] = mi;
    o.v[i] = vi;
    if (vmax) o.vmax[i] = vi = (vi != vi || vi > vmax[i]) ? vi : vmax[i];  // NaN wins, as ATen's
    const float d = std::sqrt(vi) / c.sqrt_bc2 + c.eps;
    x = x + (c.neg_step * mi) / d;
    o.p[i] = x;
    store1<W>(s.weight, i, x);
  }
}

// Runs [i, end): with streamed weights, the scalar steps up to an aligned start; then the 16-lane
// and the 8-lane vector loops (each takes what it can); then the scalar tail.
template <Out W, typename Consts, typename Scalar, typename Vec>
void drive(const StepSpan& s, const Consts& c, std::int64_t i, std::int64_t end, Scalar scalar,
           [[maybe_unused]] Vec vec) {
  const std::int64_t start = nt_start<W>(s.weight, c.stream_weight, i, end);
  const bool nt = start >= 0;
  if (nt) scalar(i, start), i = start;
#ifdef AMPACTOR_HAVE_AVX512
  i = vec(Zmm{}, i, nt);
#endif
#ifdef AMPACTOR_HAVE_F16C
  i = vec(Ymm{}, i, nt);
  if (nt) _mm_sfence();  // the streamed weights are ordered before whatever the caller does next
#endif
  scalar(i, end);
}

template <StepElem G, Out W>
void adam_loop(const StepSpan& s, const AdamConsts& c, std::int64_t i, std::int64_t end) {
  drive<W>(
      s, c, i, end, [&](std::int64_t b, std::int64_t e) { adam_scalar<G, W>(s, c, b, e); },
      [&](auto t, std::int64_t b, bool nt) {
        return adam_vec<decltype(t), G, W>(s, c, b, end, nt);
      });
}

template <StepElem G, Out W>
void sgd_scalar(const StepSpan& s, const SgdConsts& c, std::int64_t i, std::int64_t end) {
  const float* p = s.param;
  const float* m = s.m;
  const Dest o = dest_of(s);
  for (; i < end; ++i) {
    float d = load1<G>(s.grad, i) * c.inv;
    float x = p[i];
    if (c.l2) d = madd(x, c.wd, d);
    if (m) {
      const float b = c.first ? d : madd(d, c.omdamp, m[i] * c.momentum);
      o.m[i] = b;
      d = c.nesterov ? madd(b, c.momentum, d) : b;
    }
    x = madd(d, c.neg_lr, x);
    o.p[i] = x;
    store1<W>(s.weight, i, x);
  }
}

template <StepElem G, Out W>
void sgd_loop(const StepSpan& s, const SgdConsts& c, std::int64_t i, std::int64_t end) {
  drive<W>(
      s, c, i, end, [&](std::int64_t b, std::int64_t e) { sgd_scalar<G, W>(s, c, b, e); },
      [&](auto t, std::int64_t b, bool nt) {
        return sgd_vec<decltype(t), G, W>(s, c, b, end, nt);
      });
}

// out[i] = a[i] / c as the Adam loops divide by sqrt_bc2 (for tests).
void const_div(const float* a, float* out, std::int64_t n, float c) {
  std::int64_t i = 0;
  [[maybe_unused]] const bool recip = recip_ok(c);
#ifdef AMPACTOR_HAVE_AVX512
  for (const __m512 vc = Zmm::set1(c), y = Zmm::set1(1.0f / c), inf = Zmm::set1(__builtin_inff());
       i + 16 <= n; i += 16) {
    const __m512 x = Zmm::load(a + i);
    Zmm::store(out + i, recip ? div_by<Zmm>(x, vc, y, inf) : Zmm::div(x, vc));
  }
#endif
#ifdef AMPACTOR_HAVE_F16C
  for (const __m256 vc = Ymm::set1(c), y = Ymm::set1(1.0f / c), inf = Ymm::set1(__builtin_inff());
       i + 8 <= n; i += 8) {
    const __m256 x = Ymm::load(a + i);
    Ymm::store(out + i, recip ? div_by<Ymm>(x, vc, y, inf) : Ymm::div(x, vc));
  }
#endif
  for (; i < n; ++i)
    out[i] = a[i] / c;
}

inline Out out_of(const StepSpan& s) {
  if (!s.weight) return Out::none;
  switch (s.weight_type) {
    case StepElem::f16:
      return Out::f16;
    case StepElem::bf16:
      return Out::bf16;
    default:
      return Out::f32;
  }
}

// Runtime types -> the loop instantiation.
template <StepElem G>
void adam_g(const StepSpan& s, const AdamConsts& c, std::int64_t b, std::int64_t e) {
  switch (out_of(s)) {
    case Out::none:
      return adam_loop<G, Out::none>(s, c, b, e);
    case Out::f32:
      return adam_loop<G, Out::f32>(s, c, b, e);
    case Out::f16:
      return adam_loop<G, Out::f16>(s, c, b, e);
    case Out::bf16:
      return adam_loop<G, Out::bf16>(s, c, b, e);
  }
}
template <StepElem G>
void sgd_g(const StepSpan& s, const SgdConsts& c, std::int64_t b, std::int64_t e) {
  switch (out_of(s)) {
    case Out::none:
      return sgd_loop<G, Out::none>(s, c, b, e);
    case Out::f32:
      return sgd_loop<G, Out::f32>(s, c, b, e);
    case Out::f16:
      return sgd_loop<G, Out::f16>(s, c, b, e);
    case Out::bf16:
      return sgd_loop<G, Out::bf16>(s, c, b, e);
  }
}

void adam(const StepSpan& s, const AdamConsts& c, std::int64_t b, std::int64_t e) {
  switch (s.grad_type) {
    case StepElem::f16:
      return adam_g<StepElem::f16>(s, c, b, e);
    case StepElem::bf16:
      return adam_g<StepElem::bf16>(s, c, b, e);
    default:
      return adam_g<StepElem::f32>(s, c, b, e);
  }
}
void sgd(const StepSpan& s, const SgdConsts& c, std::int64_t b, std::int64_t e) {
  switch (s.grad_type) {
    case StepElem::f16:
      return sgd_g<StepElem::f16>(s, c, b, e);
    case StepElem::bf16:
      return sgd_g<StepElem::bf16>(s, c, b, e);
    default:
      return sgd_g<StepElem::f32>(s, c, b, e);
  }
}

}  // namespace

const OptimLoopTable& optim_table() {
  static const OptimLoopTable t{&adam, &sgd, &const_div, AMPACTOR_LOOPS_NAME};
  return t;
}

}  // namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS
