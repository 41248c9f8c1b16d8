// The fused optimizer steps' loop bodies, shared by every instruction-set variant (included by one
// .cpp per variant, as loops_impl.h). Each element follows torch::optim's sequence of ATen ops
// exactly: the AVX2 variant fuses the multiply-adds that ATen's AVX2/AVX-512 kernels fuse
// (add with alpha, addcmul), the baseline fuses none, as ATen's default kernels; sqrt and the
// divisions are correctly rounded in all. The AVX-512 variant runs the AVX2 variant's operations
// 16 lanes at a time: every element gets the same operations, so the same bits. Compiled with
// -ffp-contract=off so that no other expression is fused behind our back.
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

#ifdef AMPACTOR_HAVE_F16C
template <StepElem G>
inline __m256 load8(const void* p, std::int64_t i) {
  if constexpr (G == StepElem::f32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const auto* h = reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i);
  if constexpr (G == StepElem::f16) return _mm256_cvtph_ps(_mm_loadu_si128(h));
  if constexpr (G == StepElem::bf16) return bf16x8_to_float(_mm_loadu_si128(h));
}
// (No pointer arithmetic for Out::none: p is null there.)
template <Out W>
inline void store8(void* p, std::int64_t i, __m256 x) {
  auto h = [&] { return reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(p) + i); };
  if constexpr (W == Out::f32) _mm256_storeu_ps(static_cast<float*>(p) + i, x);
  if constexpr (W == Out::f16) _mm_storeu_si128(h(), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  if constexpr (W == Out::bf16) _mm_storeu_si128(h(), float_to_bf16x8(x));
}
#endif

#ifdef AMPACTOR_HAVE_AVX512
template <StepElem G>
inline __m512 load16(const void* p, std::int64_t i) {
  if constexpr (G == StepElem::f32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  const auto* h = reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i);
  if constexpr (G == StepElem::f16) return _mm512_cvtph_ps(_mm256_loadu_si256(h));
  if constexpr (G == StepElem::bf16) return bf16x16_to_float(_mm256_loadu_si256(h));
}
template <Out W>
inline void store16(void* p, std::int64_t i, __m512 x) {
  auto h = [&] { return reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(p) + i); };
  if constexpr (W == Out::f32) _mm512_storeu_ps(static_cast<float*>(p) + i, x);
  if constexpr (W == Out::f16)
    _mm256_storeu_si256(h(), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  if constexpr (W == Out::bf16) _mm256_storeu_si256(h(), float_to_bf16x16(x));
}

// adam_loop's AVX2 body, 16 lanes at a time; returns where it stopped.
template <StepElem G, Out W>
std::int64_t adam_zmm(const StepSpan& s, const AdamConsts& c, std::int64_t i, std::int64_t end) {
  float* __restrict p = s.param;
  float* __restrict m = s.m;
  float* __restrict v = s.v;
  float* __restrict vmax = s.vmax;
  const __m512 inv = _mm512_set1_ps(c.inv), wd = _mm512_set1_ps(c.wd),
               decay = _mm512_set1_ps(c.decay), b1 = _mm512_set1_ps(c.b1),
               omb1 = _mm512_set1_ps(c.omb1), b2 = _mm512_set1_ps(c.b2),
               omb2 = _mm512_set1_ps(c.omb2), sbc2 = _mm512_set1_ps(c.sqrt_bc2),
               eps = _mm512_set1_ps(c.eps), neg = _mm512_set1_ps(c.neg_step);
  for (; i + 16 <= end; i += 16) {
    __m512 g = _mm512_mul_ps(load16<G>(s.grad, i), inv);
    __m512 x = _mm512_loadu_ps(p + i);
    if (c.l2) g = _mm512_fmadd_ps(x, wd, g);
    if (c.decoupled) x = _mm512_mul_ps(x, decay);
    const __m512 mi = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(_mm512_loadu_ps(m + i), b1));
    __m512 vi =
        _mm512_fmadd_ps(_mm512_mul_ps(omb2, g), g, _mm512_mul_ps(_mm512_loadu_ps(v + i), b2));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    if (vmax) {  // NaN wins, as in the AVX2 body
      const __m512 mx = _mm512_max_ps(vi, _mm512_loadu_ps(vmax + i));
      vi = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vi, vi, _CMP_UNORD_Q), mx, vi);
      _mm512_storeu_ps(vmax + i, vi);
    }
    const __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), sbc2), eps);
    x = _mm512_add_ps(x, _mm512_div_ps(_mm512_mul_ps(neg, mi), d));
    _mm512_storeu_ps(p + i, x);
    store16<W>(s.weight, i, x);
  }
  return i;
}

// sgd_loop's AVX2 body, 16 lanes at a time; returns where it stopped.
template <StepElem G, Out W>
std::int64_t sgd_zmm(const StepSpan& s, const SgdConsts& c, std::int64_t i, std::int64_t end) {
  float* __restrict p = s.param;
  float* __restrict m = s.m;
  const __m512 inv = _mm512_set1_ps(c.inv), wd = _mm512_set1_ps(c.wd),
               mom = _mm512_set1_ps(c.momentum), omd = _mm512_set1_ps(c.omdamp),
               neg = _mm512_set1_ps(c.neg_lr);
  for (; i + 16 <= end; i += 16) {
    __m512 d = _mm512_mul_ps(load16<G>(s.grad, i), inv);
    __m512 x = _mm512_loadu_ps(p + i);
    if (c.l2) d = _mm512_fmadd_ps(x, wd, d);
    if (m) {
      const __m512 b =
          c.first ? d : _mm512_fmadd_ps(d, omd, _mm512_mul_ps(_mm512_loadu_ps(m + i), mom));
      _mm512_storeu_ps(m + i, b);
      d = c.nesterov ? _mm512_fmadd_ps(b, mom, d) : b;
    }
    x = _mm512_fmadd_ps(d, neg, x);
    _mm512_storeu_ps(p + i, x);
    store16<W>(s.weight, i, x);
  }
  return i;
}
#endif

template <StepElem G, Out W>
void adam_loop(const StepSpan& s, const AdamConsts& c, std::int64_t i, std::int64_t end) {
  float* __restrict p = s.param;
  float* __restrict m = s.m;
  float* __restrict v = s.v;
  float* __restrict vmax = s.vmax;
#ifdef AMPACTOR_HAVE_AVX512
  i = adam_zmm<G, W>(s, c, i, end);  // the AVX2 loop below takes a remaining 8
#endif
#ifdef AMPACTOR_HAVE_F16C
  const __m256 inv = _mm256_set1_ps(c.inv), wd = _mm256_set1_ps(c.wd),
               decay = _mm256_set1_ps(c.decay), b1 = _mm256_set1_ps(c.b1),
               omb1 = _mm256_set1_ps(c.omb1), b2 = _mm256_set1_ps(c.b2),
               omb2 = _mm256_set1_ps(c.omb2), sbc2 = _mm256_set1_ps(c.sqrt_bc2),
               eps = _mm256_set1_ps(c.eps), neg = _mm256_set1_ps(c.neg_step);
  for (; i + 8 <= end; i += 8) {
    __m256 g = _mm256_mul_ps(load8<G>(s.grad, i), inv);
    __m256 x = _mm256_loadu_ps(p + i);
    if (c.l2) g = _mm256_fmadd_ps(x, wd, g);
    if (c.decoupled) x = _mm256_mul_ps(x, decay);
    const __m256 mi = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
    __m256 vi =
        _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if (vmax) {
      // max_ps gives its second operand where either is NaN; ATen's max gives NaN.
      vi = _mm256_blendv_ps(_mm256_max_ps(vi, _mm256_loadu_ps(vmax + i)), vi,
                            _mm256_cmp_ps(vi, vi, _CMP_UNORD_Q));
      _mm256_storeu_ps(vmax + i, vi);
    }
    const __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), sbc2), eps);
    x = _mm256_add_ps(x, _mm256_div_ps(_mm256_mul_ps(neg, mi), d));
    _mm256_storeu_ps(p + i, x);
    store8<W>(s.weight, i, x);
  }
#endif
  for (; i < end; ++i) {
    float g = load1<G>(s.grad, i) * c.inv;
    float x = p[i];
    if (c.l2) g = madd(x, c.wd, g);
    if (c.decoupled) x = x * c.decay;
    const float mi = madd(g, c.omb1, m[i] * c.b1);
    float vi = madd(c.omb2 * g, g, v[i] * c.b2);
    m[i] = mi;
    v[i] = vi;
    if (vmax) vmax[i] = vi = (vi != vi || vi > vmax[i]) ? vi : vmax[i];  // NaN wins, as ATen's
    const float d = std::sqrt(vi) / c.sqrt_bc2 + c.eps;
    x = x + (c.neg_step * mi) / d;
    p[i] = x;
    store1<W>(s.weight, i, x);
  }
}

template <StepElem G, Out W>
void sgd_loop(const StepSpan& s, const SgdConsts& c, std::int64_t i, std::int64_t end) {
  float* __restrict p = s.param;
  float* __restrict m = s.m;
#ifdef AMPACTOR_HAVE_AVX512
  i = sgd_zmm<G, W>(s, c, i, end);
#endif
#ifdef AMPACTOR_HAVE_F16C
  const __m256 inv = _mm256_set1_ps(c.inv), wd = _mm256_set1_ps(c.wd),
               mom = _mm256_set1_ps(c.momentum), omd = _mm256_set1_ps(c.omdamp),
               neg = _mm256_set1_ps(c.neg_lr);
  for (; i + 8 <= end; i += 8) {
    __m256 d = _mm256_mul_ps(load8<G>(s.grad, i), inv);
    __m256 x = _mm256_loadu_ps(p + i);
    if (c.l2) d = _mm256_fmadd_ps(x, wd, d);
    if (m) {
      const __m256 b =
          c.first ? d : _mm256_fmadd_ps(d, omd, _mm256_mul_ps(_mm256_loadu_ps(m + i), mom));
      _mm256_storeu_ps(m + i, b);
      d = c.nesterov ? _mm256_fmadd_ps(b, mom, d) : b;
    }
    x = _mm256_fmadd_ps(d, neg, x);
    _mm256_storeu_ps(p + i, x);
    store8<W>(s.weight, i, x);
  }
#endif
  for (; i < end; ++i) {
    float d = load1<G>(s.grad, i) * c.inv;
    float x = p[i];
    if (c.l2) d = madd(x, c.wd, d);
    if (m) {
      const float b = c.first ? d : madd(d, c.omdamp, m[i] * c.momentum);
      m[i] = b;
      d = c.nesterov ? madd(b, c.momentum, d) : b;
    }
    x = madd(d, c.neg_lr, x);
    p[i] = x;
    store1<W>(s.weight, i, x);
  }
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
  static const OptimLoopTable t{&adam, &sgd, AMPACTOR_LOOPS_NAME};
  return t;
}

}  // namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS
