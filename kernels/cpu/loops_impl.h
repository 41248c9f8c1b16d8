// Loop bodies shared by every instruction-set variant. Included by one .cpp per variant, each
// compiled with its own -m flags and defining AMPACTOR_LOOPS_NS; plain loops are written so that
// GCC vectorises them, and the fp16 conversions use F16C when the variant has it; the AVX-512
// variant runs the 16-bit loops in loops_avx512.h. The grad-move loops are in loops_move.h.
// Everything here has internal linkage and no inline function from another library is called:
// a weak symbol built with -mavx2 must never be picked for the baseline variant.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define AMPACTOR_HAVE_F16C 1
#endif

#include "loops.h"

namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS {
namespace {

#include "loops_bits.h"

// The vector helpers, which use loops_bits.h:
#include "loops_avx512.h"
#include "loops_f16c.h"

// Every loop is a template on kMax: false is the plain loop, true also raises *absmax to the
// largest finite |x| read (before the multiply), kept as integer bits in the same pass.

// ---- float / double: one loop, vectorised by the compiler for stride 1 ----
template <typename T>
struct Ieee;
template <>
struct Ieee<float> {
  using Bits = std::uint32_t;
  static constexpr Bits kAbs = 0x7fffffffu, kInf = 0x7f800000u;
  static Bits bad(Bits b) { return Bits(nonfinite_bits(b)); }
  static Bits fabs(Bits b) { return finite_abs32(b); }
  static void raise(float* out, Bits m) { raise_f32_bits(out, m); }
};
template <>
struct Ieee<double> {
  using Bits = std::uint64_t;
  static constexpr Bits kAbs = 0x7fffffffffffffffull, kInf = 0x7ff0000000000000ull;
  static Bits bad(Bits b) { return Bits(nonfinite_bits64(b)); }
  static Bits fabs(Bits b) { return finite_abs64(b); }
  static void raise(float* out, Bits m) { raise_f64_bits(out, m); }
};

// The dense check_max loops go in blocks: the plain max of |x| over a block (two operations per
// vector, fewer than the plain loop's test) is the finite max and says "nothing bad" whenever it
// is below the first non-finite pattern; only a block holding an inf or NaN is masked again.
constexpr std::int64_t kMaxBlock = 64;
template <typename Bits, Bits kAbs, Bits kInf>
bool block_max(const Bits* u, std::int64_t n, Bits& mx) {
  Bits m = 0;
  for (std::int64_t j = 0; j < n; ++j)
    m = umax(m, Bits(u[j] & kAbs));
  if (m < kInf) {
    mx = umax(mx, m);
    return false;
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const Bits a = Bits(u[j] & kAbs);
    mx = umax(mx, Bits(a & Bits(Bits(0) - Bits(a < kInf))));
  }
  return true;
}
template <typename T>
bool block_max_ieee(const T* x, std::int64_t n, typename Ieee<T>::Bits& mx) {
  using Bits = typename Ieee<T>::Bits;
  const Bits* u = reinterpret_cast<const Bits*>(x);
  if constexpr (sizeof(T) == 4)
    return block_max<Bits, 0x7fffffffu, 0x7f800000u>(u, n, mx);
  else
    return block_max<Bits, 0x7fffffffffffffffull, 0x7ff0000000000000ull>(u, n, mx);
}

template <typename T, bool kMax>
bool unscale_ieee(T* x, std::int64_t n, std::int64_t stride, T inv, float* absmax) {
  using I = Ieee<T>;
  typename I::Bits bad = 0, mx = 0;
  if (kMax && stride == 1) {
    // The max of every |x| says whether one was inf or NaN: it replaces the test.
    typename I::Bits all = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      T v = x[i];
      typename I::Bits b;
      std::memcpy(&b, &v, sizeof(T));
      all = umax(all, typename I::Bits(b & I::kAbs));
      mx = umax(mx, I::fabs(b));
      x[i] = v * inv;
    }
    bad = all >= I::kInf;
  } else if (stride == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      T v = x[i];
      typename I::Bits b;
      std::memcpy(&b, &v, sizeof(T));
      bad |= I::bad(b);
      if constexpr (kMax) mx = umax(mx, I::fabs(b));
      x[i] = v * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      T& r = x[i * stride];
      typename I::Bits b;
      std::memcpy(&b, &r, sizeof(T));
      bad |= I::bad(b);
      if constexpr (kMax) mx = umax(mx, I::fabs(b));
      r = r * inv;
    }
  }
  if constexpr (kMax) I::raise(absmax, mx);
  return bad != 0;
}

// Exponent bits tested into one accumulator: an AND at the end is all the branch we need.
template <typename T, bool kMax>
bool check_ieee(const T* x, std::int64_t n, std::int64_t stride, float* absmax) {
  using I = Ieee<T>;
  const typename I::Bits* u = reinterpret_cast<const typename I::Bits*>(x);
  typename I::Bits bad = 0, mx = 0;
  if (kMax && stride == 1) {
    for (std::int64_t i = 0; i < n; i += kMaxBlock)
      bad |= typename I::Bits(block_max_ieee(x + i, n - i < kMaxBlock ? n - i : kMaxBlock, mx));
  } else if (stride == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      bad |= I::bad(u[i]);
      if constexpr (kMax) mx = umax(mx, I::fabs(u[i]));
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      bad |= I::bad(u[i * stride]);
      if constexpr (kMax) mx = umax(mx, I::fabs(u[i * stride]));
    }
  }
  if constexpr (kMax) I::raise(absmax, mx);
  return bad != 0;
}

// ---- 16-bit types ----
inline void raise16(float* out, std::uint16_t m, std::uint16_t exp_mask) {
  const float f = exp_mask == 0x7c00u ? half_to_float(m) : bf16_to_float(m);
  if (f > *out) *out = f;
}

template <bool kMax>
bool check_16(const std::uint16_t* x, std::int64_t n, std::int64_t stride, std::uint16_t mask,
              float* absmax) {
  std::uint16_t bad = 0, mx = 0;
#ifdef AMPACTOR_HAVE_AVX512
  if (stride == 1) {
    const bool found = mask == 0x7c00u ? check_16_zmm<0x7c00u, kMax>(x, n, mx)
                                       : check_16_zmm<0x7f80u, kMax>(x, n, mx);
    if constexpr (kMax) raise16(absmax, mx, mask);
    return found;
  }
#endif
  if (kMax && stride == 1) {
    for (std::int64_t i = 0; i < n; i += kMaxBlock) {
      const std::int64_t m = n - i < kMaxBlock ? n - i : kMaxBlock;
      bad |=
          std::uint16_t(mask == 0x7c00u ? block_max<std::uint16_t, 0x7fffu, 0x7c00u>(x + i, m, mx)
                                        : block_max<std::uint16_t, 0x7fffu, 0x7f80u>(x + i, m, mx));
    }
  } else if (stride == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      bad |= std::uint16_t((x[i] & mask) == mask);
      if constexpr (kMax) mx = umax(mx, finite_abs16(x[i], mask));
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      bad |= std::uint16_t((x[i * stride] & mask) == mask);
      if constexpr (kMax) mx = umax(mx, finite_abs16(x[i * stride], mask));
    }
  }
  if constexpr (kMax) raise16(absmax, mx, mask);
  return bad != 0;
}

// In-place unscale of fp16 (kBf16 false) or bf16 (true) values, in float.
template <bool kBf16, bool kMax>
bool unscale_16(std::uint16_t* x, std::int64_t n, std::int64_t stride, float inv, float* absmax) {
  constexpr std::uint16_t kExp = kBf16 ? 0x7f80u : 0x7c00u;
  std::int64_t i = 0;
  bool found = false;
  std::uint16_t mx = 0;
#if defined(AMPACTOR_HAVE_AVX512)
  if (stride == 1) {
    found = unscale_16_zmm<kBf16, kMax>(x, n, inv, mx);
    i = n;
  }
#elif defined(AMPACTOR_HAVE_F16C)
  if (stride == 1) {
    const __m128i exp_mask = _mm_set1_epi16(std::int16_t(kExp));
    const __m256 vinv = _mm256_set1_ps(inv);
    auto convert = [&](__m128i h) {
      if constexpr (kBf16)
        return float_to_bf16x8(_mm256_mul_ps(bf16x8_to_float(h), vinv));
      else
        return _mm256_cvtps_ph(_mm256_mul_ps(_mm256_cvtph_ps(h), vinv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    };
    __m128i bad = _mm_setzero_si128(), vmax = _mm_setzero_si128();
    if constexpr (kMax)
      found = max_blocks<kExp>(x, n, i, vmax, [&](__m128i h, int k) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i + 8 * k), convert(h));
      });
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
      const __m128i b = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
      bad = _mm_or_si128(bad, b);
      if constexpr (kMax) vmax = _mm_max_epu16(vmax, finite_abs16x8(h, b));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i), convert(h));
    }
    found = found || _mm_movemask_epi8(bad) != 0;
    if constexpr (kMax) mx = hmax16x8(vmax);
  }
#endif
  std::uint16_t bad = 0;
  for (; i < n; ++i) {
    std::uint16_t& r = x[i * stride];
    bad |= std::uint16_t((r & kExp) == kExp);
    if constexpr (kMax) mx = umax(mx, finite_abs16(r, kExp));
    r = kBf16 ? float_to_bf16(bf16_to_float(r) * inv) : float_to_half(half_to_float(r) * inv);
  }
  if constexpr (kMax) raise16(absmax, mx, kExp);
  return found || bad != 0;
}

// ---- grad move: model grads (any type) -> fp32 masters ----
#include "loops_move.h"

// ---- the table ----
template <bool kMax>
bool unscale(ElemType t, void* x, std::int64_t n, std::int64_t stride, float inv, float* absmax) {
  switch (t) {
    case ElemType::f32:
      return unscale_ieee<float, kMax>(static_cast<float*>(x), n, stride, inv, absmax);
    case ElemType::f64:
      return unscale_ieee<double, kMax>(static_cast<double*>(x), n, stride, double(inv), absmax);
    case ElemType::f16:
      return unscale_16<false, kMax>(static_cast<std::uint16_t*>(x), n, stride, inv, absmax);
    case ElemType::bf16:
      return unscale_16<true, kMax>(static_cast<std::uint16_t*>(x), n, stride, inv, absmax);
  }
  return false;
}

template <bool kMax>
bool check(ElemType t, const void* x, std::int64_t n, std::int64_t stride, float* absmax) {
  switch (t) {
    case ElemType::f32:
      return check_ieee<float, kMax>(static_cast<const float*>(x), n, stride, absmax);
    case ElemType::f64:
      return check_ieee<double, kMax>(static_cast<const double*>(x), n, stride, absmax);
    case ElemType::f16:
      return check_16<kMax>(static_cast<const std::uint16_t*>(x), n, stride, 0x7c00u, absmax);
    case ElemType::bf16:
      return check_16<kMax>(static_cast<const std::uint16_t*>(x), n, stride, 0x7f80u, absmax);
  }
  return false;
}

template <bool kMax>
bool move(ElemType t, const void* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
          float inv, float* absmax) {
  switch (t) {
    case ElemType::f32:
      return move_f32<kMax>(static_cast<const float*>(src), ss, dst, ds, n, inv, absmax);
    case ElemType::f64:
      return move_f64<kMax>(static_cast<const double*>(src), ss, dst, ds, n, inv, absmax);
    case ElemType::f16:
      return move_half<kMax>(static_cast<const std::uint16_t*>(src), ss, dst, ds, n, inv, absmax);
    case ElemType::bf16:
      return move_bf16<kMax>(static_cast<const std::uint16_t*>(src), ss, dst, ds, n, inv, absmax);
  }
  return false;
}

}  // namespace

const LoopTable& table() {
  static const LoopTable t{&unscale<false>, &check<false>, &move<false>,       &unscale<true>,
                           &check<true>,    &move<true>,   AMPACTOR_LOOPS_NAME};
  return t;
}

}  // namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS
