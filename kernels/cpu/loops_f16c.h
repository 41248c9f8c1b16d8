// The F16C/AVX2 vector helpers of the 16-bit loops. Included by loops_impl.h inside its
// per-variant anonymous namespace, after loops_bits.h; empty without F16C.
// No include guard and no includes: included exactly once, inside that namespace.
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

#ifdef AMPACTOR_HAVE_F16C
// The 8-lane form of finite_abs16: |h| where the lane is finite, 0 where `bad` marks it.
inline __m128i finite_abs16x8(__m128i h, __m128i bad) {
  return _mm_andnot_si128(bad, _mm_and_si128(h, _mm_set1_epi16(0x7fff)));
}
inline std::uint16_t hmax16x8(__m128i v) {
  alignas(16) std::uint16_t lanes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), v);
  std::uint16_t m = 0;
  for (std::uint16_t l : lanes)
    m = umax(m, l);
  return m;
}
#endif

#ifdef AMPACTOR_HAVE_F16C
// Blocks of 4 vectors for the *_max forms: the max of |x| over the block decides everything in the
// common case (no inf or NaN there: it is the finite max, and nothing is bad), so the block costs
// fewer operations than the plain loop's per-vector test; a block with an inf or NaN re-masks.
// `out(h, k)` converts and stores vector k of the block. Returns whether a lane was inf or NaN.
template <std::uint16_t kExp, typename Out>
bool max_blocks(const std::uint16_t* x, std::int64_t n, std::int64_t& i, __m128i& vmax, Out&& out) {
  const __m128i abs_mask = _mm_set1_epi16(0x7fff);
  const __m128i exp_mask = _mm_set1_epi16(std::int16_t(kExp));
  const __m128i below = _mm_set1_epi16(std::int16_t(kExp - 1));
  bool bad = false;
  for (; i + 32 <= n; i += 32) {
    __m128i h[4];
    __m128i m = _mm_setzero_si128();
    for (int k = 0; k < 4; ++k) {
      h[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 8 * k));
      m = _mm_max_epu16(m, _mm_and_si128(h[k], abs_mask));
    }
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(m, below)) != 0) {  // |x| <= 0x7fff: signed is fine
      bad = true;
      for (int k = 0; k < 4; ++k)
        vmax = _mm_max_epu16(
            vmax, finite_abs16x8(h[k], _mm_cmpeq_epi16(_mm_and_si128(h[k], exp_mask), exp_mask)));
    } else {
      vmax = _mm_max_epu16(vmax, m);
    }
    for (int k = 0; k < 4; ++k)
      out(h[k], k);
  }
  return bad;
}
#endif
