// The grad-move loops of loops_impl.h: model grads of any type into the fp32 masters, unscaled and
// checked in the same pass. Included by loops_impl.h inside its per-variant anonymous namespace,
// after its 16-bit loops (raise16); internal linkage for the reason given there.
// No include guard and no includes: included exactly once, inside that namespace.
template <bool kMax>
bool move_f32(const float* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
              float inv, float* absmax) {
  std::uint32_t bad = 0, mx = 0;
  if (ss == 1 && ds == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      float v = src[i];
      std::uint32_t b;
      std::memcpy(&b, &v, 4);
      bad |= std::uint32_t(nonfinite_bits(b));
      if constexpr (kMax) mx = umax(mx, finite_abs32(b));
      dst[i] = v * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      float v = src[i * ss];
      std::uint32_t b;
      std::memcpy(&b, &v, 4);
      bad |= std::uint32_t(nonfinite_bits(b));
      if constexpr (kMax) mx = umax(mx, finite_abs32(b));
      dst[i * ds] = v * inv;
    }
  }
  if constexpr (kMax) raise_f32_bits(absmax, mx);
  return bad != 0;
}

template <bool kMax>
bool move_f64(const double* src, std::int64_t ss, float* dst, std::int64_t ds, std::int64_t n,
              float inv, float* absmax) {
  std::uint64_t bad = 0, mx = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double v = src[i * ss];
    std::uint64_t b;
    std::memcpy(&b, &v, 8);
    bad |= std::uint64_t(nonfinite_bits64(b));
    if constexpr (kMax) mx = umax(mx, finite_abs64(b));
    dst[i * ds] = float(v * double(inv));
  }
  if constexpr (kMax) raise_f64_bits(absmax, mx);
  return bad != 0;
}

template <bool kMax>
bool move_bf16(const std::uint16_t* src, std::int64_t ss, float* dst, std::int64_t ds,
               std::int64_t n, float inv, float* absmax) {
  std::uint16_t bad = 0, mx = 0;
#ifdef AMPACTOR_HAVE_AVX512
  if (ss == 1 && ds == 1) {
    const bool found = move_16_zmm<true, kMax>(src, dst, n, inv, mx);
    if constexpr (kMax) raise16(absmax, mx, 0x7f80u);
    return found;
  }
#endif
  if (ss == 1 && ds == 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t b = src[i];
      bad |= std::uint16_t(nonfinite_bf16(b));
      if constexpr (kMax) mx = umax(mx, finite_abs16(b, 0x7f80u));
      dst[i] = bf16_to_float(b) * inv;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t b = src[i * ss];
      bad |= std::uint16_t(nonfinite_bf16(b));
      if constexpr (kMax) mx = umax(mx, finite_abs16(b, 0x7f80u));
      dst[i * ds] = bf16_to_float(b) * inv;
    }
  }
  if constexpr (kMax) raise16(absmax, mx, 0x7f80u);
  return bad != 0;
}

template <bool kMax>
bool move_half(const std::uint16_t* src, std::int64_t ss, float* dst, std::int64_t ds,
               std::int64_t n, float inv, float* absmax) {
  std::int64_t i = 0;
  bool found = false;
  std::uint16_t mx = 0;
#if defined(AMPACTOR_HAVE_AVX512)
  if (ss == 1 && ds == 1) {
    found = move_16_zmm<false, kMax>(src, dst, n, inv, mx);
    i = n;
  }
#elif defined(AMPACTOR_HAVE_F16C)
  if (ss == 1 && ds == 1) {
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m128i bad = _mm_setzero_si128(), vmax = _mm_setzero_si128();
    if constexpr (kMax)
      found = max_blocks<0x7c00u>(src, n, i, vmax, [&](__m128i h, int k) {
        _mm256_storeu_ps(dst + i + 8 * k, _mm256_mul_ps(_mm256_cvtph_ps(h), vinv));
      });
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
      bad = _mm_or_si128(bad, b);
      if constexpr (kMax) vmax = _mm_max_epu16(vmax, finite_abs16x8(h, b));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), vinv));
    }
    found = found || _mm_movemask_epi8(bad) != 0;
    if constexpr (kMax) mx = hmax16x8(vmax);
  }
#endif
  std::uint16_t bad = 0;
  for (; i < n; ++i) {
    std::uint16_t b = src[i * ss];
    bad |= std::uint16_t(nonfinite_half(b));
    if constexpr (kMax) mx = umax(mx, finite_abs16(b, 0x7c00u));
    dst[i * ds] = half_to_float(b) * inv;
  }
  if constexpr (kMax) raise16(absmax, mx, 0x7c00u);
  return found || bad != 0;
}
