// The AVX-512 vector helpers and 16-bit loops (F, BW, VL and DQ). Included by loops_impl.h and
// optim_impl.h inside their per-variant anonymous namespace, after loops_bits.h; empty unless the
// variant is compiled for AVX-512 (and has F16C: AMPACTOR_HAVE_F16C, which includes immintrin.h).
// The conversions are those of loops_bits.h, exactly: no vcvtneps2bf16 (AVX512_BF16), which
// flushes subnormals to zero. fp16 goes through vcvtph2ps/vcvtps2ph, as in the F16C loops.
// No include guard and no includes: included exactly once, inside that namespace.
#if defined(AMPACTOR_HAVE_F16C) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#define AMPACTOR_HAVE_AVX512 1
// 16 bf16 -> 16 floats: the bits shifted into the high half.
inline __m512 bf16x16_to_float(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// 16 floats -> their bf16 bits in the low half of each 32-bit lane (high half zero), rounding
// and NaN handling exactly as float_to_bf16.
inline __m512i float_to_bf16_lanes(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
}
inline __m256i float_to_bf16x16(__m512 f) {
  return _mm512_cvtepi32_epi16(float_to_bf16_lanes(f));  // every lane fits: a plain truncation
}

inline std::uint16_t hmax16x32(__m512i v) {
  alignas(64) std::uint16_t lanes[32];
  _mm512_store_si512(lanes, v);
  std::uint16_t m = 0;
  for (std::uint16_t l : lanes)
    m = umax(m, l);
  return m;
}

// The mask of the first `r` lanes of 32 (0 < r < 32).
inline __mmask32 first_lanes(std::int64_t r) {
  return __mmask32((1u << unsigned(r)) - 1u);
}

// The 16-bit loops' frame, stride 1: x[0, n) 32 values a vector, the last partial vector loaded
// masked (its missing lanes read as zero), each vector h handed to `body(i, h, k)`, k the mask of
// the lanes that exist (all ones but in the last vector). Returns whether a lane was inf or NaN:
// the max of every |x| says so (all exponent bits set is the top of the order), one integer max
// a vector. kMax also raises mx to the largest finite |x|: in blocks of 4 vectors the block's
// max is that, unless it says inf or NaN, and only then are the block's lanes masked.
template <std::uint16_t kExp, bool kMax, typename Body>
bool zmm16_loop(const std::uint16_t* x, std::int64_t n, std::uint16_t& mx, Body&& body) {
  const __m512i abs_mask = _mm512_set1_epi16(0x7fff);
  const __m512i exp_mask = _mm512_set1_epi16(std::int16_t(kExp));
  __m512i all = _mm512_setzero_si512(), finite = _mm512_setzero_si512();
  auto add_finite = [&](__m512i a) {
    finite = _mm512_mask_max_epu16(finite, _mm512_cmplt_epu16_mask(a, exp_mask), finite, a);
  };
  std::int64_t i = 0;
  if constexpr (kMax) {
    // Until the first block with an inf or NaN, `all` is the finite max too (one max a block
    // saved); from that block on, the finite max is kept apart.
    bool clean = true;
    for (; i + 128 <= n; i += 128) {
      __m512i h[4], a[4];
      __m512i m = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        h[k] = _mm512_loadu_si512(x + i + 32 * k);
        a[k] = _mm512_and_si512(h[k], abs_mask);
        m = _mm512_max_epu16(m, a[k]);
      }
      if (_mm512_cmpge_epu16_mask(m, exp_mask) != 0) {
        if (clean) finite = all, clean = false;
        for (int k = 0; k < 4; ++k)
          add_finite(a[k]);
      } else if (!clean) {
        finite = _mm512_max_epu16(finite, m);
      }
      all = _mm512_max_epu16(all, m);
      for (int k = 0; k < 4; ++k)
        body(i + 32 * k, h[k], ~__mmask32(0));
    }
    if (clean) finite = all;
  }
  auto one = [&](std::int64_t j, __m512i h, __mmask32 k) {
    const __m512i a = _mm512_and_si512(h, abs_mask);
    all = _mm512_max_epu16(all, a);
    if constexpr (kMax) add_finite(a);
    body(j, h, k);
  };
  for (; i + 32 <= n; i += 32)
    one(i, _mm512_loadu_si512(x + i), ~__mmask32(0));
  if (i < n) {
    const __mmask32 k = first_lanes(n - i);
    one(i, _mm512_maskz_loadu_epi16(k, x + i), k);
  }
  if constexpr (kMax) mx = umax(mx, hmax16x32(finite));
  return _mm512_cmpge_epu16_mask(all, exp_mask) != 0;
}

// 32 fp16 (kBf16 false) or bf16 values times inv, rounded back, in lane order.
template <bool kBf16>
inline __m512i scale16x32(__m512i h, __m512 inv) {
  if constexpr (kBf16) {
    // Within each 128-bit lane: the low and high 4 values widened in place, packed back in place.
    const __m512i zero = _mm512_setzero_si512();
    const __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, h));
    const __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, h));
    return _mm512_packus_epi32(float_to_bf16_lanes(_mm512_mul_ps(lo, inv)),
                               float_to_bf16_lanes(_mm512_mul_ps(hi, inv)));
  } else {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), inv);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), inv);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, kRound)),
                              _mm512_cvtps_ph(hi, kRound), 1);
  }
}

// unscale_16's dense path: the whole of x[0, n) in place.
template <bool kBf16, bool kMax>
bool unscale_16_zmm(std::uint16_t* x, std::int64_t n, float inv, std::uint16_t& mx) {
  constexpr std::uint16_t kExp = kBf16 ? 0x7f80u : 0x7c00u;
  const __m512 vinv = _mm512_set1_ps(inv);
  return zmm16_loop<kExp, kMax>(x, n, mx, [&](std::int64_t i, __m512i h, __mmask32 k) {
    const __m512i r = scale16x32<kBf16>(h, vinv);
    if (k == __mmask32(~0u))
      _mm512_storeu_si512(x + i, r);
    else
      _mm512_mask_storeu_epi16(x + i, k, r);
  });
}

// check_16's dense path.
template <std::uint16_t kExp, bool kMax>
bool check_16_zmm(const std::uint16_t* x, std::int64_t n, std::uint16_t& mx) {
  return zmm16_loop<kExp, kMax>(x, n, mx, [](std::int64_t, __m512i, __mmask32) {});
}

// The grad move's dense path for fp16 (kBf16 false) or bf16 sources: dst[i] = float(x[i]) * inv.
template <bool kBf16, bool kMax>
bool move_16_zmm(const std::uint16_t* src, float* dst, std::int64_t n, float inv,
                 std::uint16_t& mx) {
  constexpr std::uint16_t kExp = kBf16 ? 0x7f80u : 0x7c00u;
  const __m512 vinv = _mm512_set1_ps(inv);
  auto widen = [](__m256i h) {
    if constexpr (kBf16)
      return bf16x16_to_float(h);
    else
      return _mm512_cvtph_ps(h);
  };
  return zmm16_loop<kExp, kMax>(src, n, mx, [&](std::int64_t i, __m512i h, __mmask32 k) {
    const __m512 lo = _mm512_mul_ps(widen(_mm512_castsi512_si256(h)), vinv);
    const __m512 hi = _mm512_mul_ps(widen(_mm512_extracti64x4_epi64(h, 1)), vinv);
    if (k == __mmask32(~0u)) {
      _mm512_storeu_ps(dst + i, lo);
      _mm512_storeu_ps(dst + i + 16, hi);
    } else {
      _mm512_mask_storeu_ps(dst + i, __mmask16(k), lo);
      if (k >> 16) _mm512_mask_storeu_ps(dst + i + 16, __mmask16(k >> 16), hi);
    }
  });
}
#endif
