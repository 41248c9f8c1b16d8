// Loop bodies shared by every instruction-set variant. Included by one .cpp per variant, each
// compiled with its own -m flags and defining AMPACTOR_LOOPS_NS; plain loops are written so that
// GCC vectorises them, and the fp16 conversions use F16C when the variant has it.
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

struct Half16 {
  std::uint16_t bits;
};
struct BF16 {
  std::uint16_t bits;
};

// Non-finite means every exponent bit is set; testing bits keeps the loops branch-free and
// correct under any floating-point flags.
inline bool nonfinite_bits(std::uint32_t b) {
  return (b & 0x7f800000u) == 0x7f800000u;
}
inline bool nonfinite_bits64(std::uint64_t b) {
  return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
inline bool nonfinite_half(std::uint16_t b) {
  return (b & 0x7c00u) == 0x7c00u;
}
inline bool nonfinite_bf16(std::uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u;
}

inline float bf16_to_float(std::uint16_t b) {
  std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; a NaN stays a (quiet) NaN with its sign. Branch-free (a mask, not a
// select on a comparison of another width) so that GCC vectorises the loops using it.
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  const std::uint32_t is_nan = 0u - std::uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return std::uint16_t((rounded & ~is_nan) | (nan & is_nan));
}
// Exact: every half is a float.
inline float half_to_float(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise into a float
    std::uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as F16C and c10::Half do; a NaN stays a quiet NaN.
inline std::uint16_t float_to_half(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                      // normal half
    std::uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return std::uint16_t(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25 rounds to zero
  std::uint32_t e = a >> 23;
  std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  std::uint32_t shift = 126u - e;  // 14..24
  std::uint32_t r = m >> shift;
  std::uint32_t rem = m & ((1u << shift) - 1u);
  std::uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
  return std::uint16_t(sign | r);
}

// ---- float / double: one loop, vectorised by the compiler for stride 1 ----
template <typename T, typename Bits>
bool unscale_ieee(T* x, std::int64_t n, std::int64_t stride, T inv) {
  Bits bad = 0;
  if (stride == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      T v = x[i];
      Bits b;
      std::memcpy(&b, &v, sizeof(T));
      if constexpr (sizeof(T) == 4) {
        bad |= Bits(nonfinite_bits(b));
      } else {
        bad |= Bits(nonfinite_bits64(b));
      }
      x[i] = v * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      T& r = x[i * stride];
      Bits b;
      std::memcpy(&b, &r, sizeof(T));
      if constexpr (sizeof(T) == 4) {
        bad |= Bits(nonfinite_bits(b));
      } else {
        bad |= Bits(nonfinite_bits64(b));
      }
      r = r * inv;
    }
  }
  return bad != 0;
}

template <typename T, typename Bits>
bool check_ieee(const T* x, std::int64_t n, std::int64_t stride) {
  Bits bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, x + i * stride, sizeof(T));
    if constexpr (sizeof(T) == 4) {
      bad |= Bits(nonfinite_bits(b));
    } else {
      bad |= Bits(nonfinite_bits64(b));
    }
  }
  return bad != 0;
}

template <typename T>
bool check_ieee_dense(const T* x, std::int64_t n) {
  // Exponent bits ORed into one accumulator: an AND at the end is all the branch we need.
  if constexpr (sizeof(T) == 4) {
    const std::uint32_t* u = reinterpret_cast<const std::uint32_t*>(x);
    std::uint32_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
      bad |= std::uint32_t((u[i] & 0x7f800000u) == 0x7f800000u);
    return bad != 0;
  } else {
    const std::uint64_t* u = reinterpret_cast<const std::uint64_t*>(x);
    std::uint64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
      bad |= std::uint64_t(nonfinite_bits64(u[i]));
    return bad != 0;
  }
}

// ---- 16-bit types ----
inline bool check_16(const std::uint16_t* x, std::int64_t n, std::int64_t stride,
                     std::uint16_t mask) {
  std::uint16_t bad = 0;
  if (stride == 1) {
    for (std::int64_t i = 0; i < n; ++i)
      bad |= std::uint16_t((x[i] & mask) == mask);
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      bad |= std::uint16_t((x[i * stride] & mask) == mask);
  }
  return bad != 0;
}

#ifdef AMPACTOR_HAVE_F16C
// 8 bf16 -> 8 floats: the bits shifted into the high half.
inline __m256 bf16x8_to_float(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// 8 floats -> 8 bf16, rounding and NaN handling exactly as float_to_bf16.
inline __m128i float_to_bf16x8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#endif

bool unscale_bf16(std::uint16_t* x, std::int64_t n, std::int64_t stride, float inv) {
  std::int64_t i = 0;
  bool found = false;
#ifdef AMPACTOR_HAVE_F16C
  if (stride == 1) {
    const __m128i exp_mask = _mm_set1_epi16(0x7f80);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m128i bad = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
      bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i),
                       float_to_bf16x8(_mm256_mul_ps(bf16x8_to_float(h), vinv)));
    }
    found = _mm_movemask_epi8(bad) != 0;
  }
#endif
  std::uint16_t bad = 0;
  for (; i < n; ++i) {
    std::uint16_t& r = x[i * stride];
    bad |= std::uint16_t(nonfinite_bf16(r));
    r = float_to_bf16(bf16_to_float(r) * inv);
  }
  return found || bad != 0;
}

bool unscale_half(std::uint16_t* x, std::int64_t n, std::int64_t stride, float inv) {
  std::int64_t i = 0;
  bool found = false;
#ifdef AMPACTOR_HAVE_F16C
  if (stride == 1) {
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m128i bad = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
      bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
      __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), vinv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i),
                       _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    found = _mm_movemask_epi8(bad) != 0;
  }
#endif
  std::uint16_t bad = 0;
  for (; i < n; ++i) {
    std::uint16_t& r = x[i * stride];
    bad |= std::uint16_t(nonfinite_half(r));
    r = float_to_half(half_to_float(r) * inv);
  }
  return found || bad != 0;
}

// ---- grad move: model grads (any type) -> fp32 masters ----
bool move_f32(const float* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
              float inv) {
  std::uint32_t bad = 0;
  if (ss == 1 && ds == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      float v = src[i];
      std::uint32_t b;
      std::memcpy(&b, &v, 4);
      bad |= std::uint32_t(nonfinite_bits(b));
      dst[i] = v * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      float v = src[i * ss];
      std::uint32_t b;
      std::memcpy(&b, &v, 4);
      bad |= std::uint32_t(nonfinite_bits(b));
      dst[i * ds] = v * inv;
    }
  }
  return bad != 0;
}

bool move_f64(const double* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
              float inv) {
  std::uint64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double v = src[i * ss];
    std::uint64_t b;
    std::memcpy(&b, &v, 8);
    bad |= std::uint64_t(nonfinite_bits64(b));
    dst[i * ds] = float(v * double(inv));
  }
  return bad != 0;
}

bool move_bf16(const std::uint16_t* src, std::int64_t ss, float* dst, std::int64_t ds,
               std::int64_t n, float inv) {
  std::uint16_t bad = 0;
  if (ss == 1 && ds == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t b = src[i];
      bad |= std::uint16_t(nonfinite_bf16(b));
      dst[i] = bf16_to_float(b) * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t b = src[i * ss];
      bad |= std::uint16_t(nonfinite_bf16(b));
      dst[i * ds] = bf16_to_float(b) * inv;
    }
  }
  return bad != 0;
}

bool move_half(const std::uint16_t* src, std::int64_t ss, float* dst, std::int64_t ds,
               std::int64_t n, float inv) {
  std::int64_t i = 0;
  bool found = false;
#ifdef AMPACTOR_HAVE_F16C
  if (ss == 1 && ds == 1) {
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m128i bad = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), vinv));
    }
    found = _mm_movemask_epi8(bad) != 0;
  }
#endif
  std::uint16_t bad = 0;
  for (; i < n; ++i) {
    std::uint16_t b = src[i * ss];
    bad |= std::uint16_t(nonfinite_half(b));
    dst[i * ds] = half_to_float(b) * inv;
  }
  return found || bad != 0;
}

// ---- the table ----
bool unscale(ElemType t, void* x, std::int64_t n, std::int64_t stride, float inv) {
  switch (t) {
    case ElemType::f32:
      return unscale_ieee<float, std::uint32_t>(static_cast<float*>(x), n, stride, inv);
    case ElemType::f64:
      return unscale_ieee<double, std::uint64_t>(static_cast<double*>(x), n, stride, double(inv));
    case ElemType::f16:
      return unscale_half(static_cast<std::uint16_t*>(x), n, stride, inv);
    case ElemType::bf16:
      return unscale_bf16(static_cast<std::uint16_t*>(x), n, stride, inv);
  }
  return false;
}

bool check(ElemType t, const void* x, std::int64_t n, std::int64_t stride) {
  switch (t) {
    case ElemType::f32:
      return stride == 1
                 ? check_ieee_dense(static_cast<const float*>(x), n)
                 : check_ieee<float, std::uint32_t>(static_cast<const float*>(x), n, stride);
    case ElemType::f64:
      return stride == 1
                 ? check_ieee_dense(static_cast<const double*>(x), n)
                 : check_ieee<double, std::uint64_t>(static_cast<const double*>(x), n, stride);
    case ElemType::f16:
      return check_16(static_cast<const std::uint16_t*>(x), n, stride, 0x7c00u);
    case ElemType::bf16:
      return check_16(static_cast<const std::uint16_t*>(x), n, stride, 0x7f80u);
  }
  return false;
}

bool move(ElemType t, const void* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
          float inv) {
  switch (t) {
    case ElemType::f32:
      return move_f32(static_cast<const float*>(src), ss, dst, ds, n, inv);
    case ElemType::f64:
      return move_f64(static_cast<const double*>(src), ss, dst, ds, n, inv);
    case ElemType::f16:
      return move_half(static_cast<const std::uint16_t*>(src), ss, dst, ds, n, inv);
    case ElemType::bf16:
      return move_bf16(static_cast<const std::uint16_t*>(src), ss, dst, ds, n, inv);
  }
  return false;
}

}  // namespace

const LoopTable& table() {
  static const LoopTable t{&unscale, &check, &move, AMPACTOR_LOOPS_NAME};
  return t;
}

}  // namespace ampactor::kernels::cpu::AMPACTOR_LOOPS_NS
