// The fused steps' vector forms, one traits struct per width (Ymm: AVX2 + F16C + FMA, 8 lanes;
// Zmm: AVX-512, 16 lanes), so that one loop body serves both; every lane gets the same
// operations at either width, so the same bits. Included by optim_impl.h inside its per-variant
// anonymous namespace, after loops_bits.h, loops_avx512.h and the Out enum.
// No include guard and no includes: included exactly once, inside that namespace.
#ifdef AMPACTOR_HAVE_F16C
struct Ymm {  // 8 lanes, AVX2 + F16C + FMA
  using V = __m256;
  static constexpr std::int64_t kLanes = 8;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  // x == y ? a : b, lane by lane.
  static V select_eq(V x, V y, V a, V b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, y, _CMP_EQ_OQ));
  }
  // ATen's max: NaN in either wins (max_ps alone gives its second operand where either is NaN).
  static V max_nan(V v, V old) {
    return _mm256_blendv_ps(_mm256_max_ps(v, old), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  template <StepElem G>
  static V load_grad(const void* p, std::int64_t i) {
    if constexpr (G == StepElem::f32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    const auto* h = reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i);
    if constexpr (G == StepElem::f16) return _mm256_cvtph_ps(_mm_loadu_si128(h));
    if constexpr (G == StepElem::bf16) return bf16x8_to_float(_mm_loadu_si128(h));
  }
  // (No pointer arithmetic for Out::none: p is null there.)
  // nt: a non-temporal store (the address aligned to the vector's width, see aligned_from).
  template <Out W>
  static void store_weight(void* p, std::int64_t i, V x, bool nt) {
    auto h = [&] { return reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(p) + i); };
    auto put = [&](__m128i b) { nt ? _mm_stream_si128(h(), b) : _mm_storeu_si128(h(), b); };
    if constexpr (W == Out::f32) {
      float* f = static_cast<float*>(p) + i;
      nt ? _mm256_stream_ps(f, x) : _mm256_storeu_ps(f, x);
    }
    if constexpr (W == Out::f16) put(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if constexpr (W == Out::bf16) put(float_to_bf16x8(x));
  }
};
#endif

#ifdef AMPACTOR_HAVE_AVX512
struct Zmm {  // 16 lanes, AVX-512 F/BW/VL/DQ
  using V = __m512;
  static constexpr std::int64_t kLanes = 16;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V select_eq(V x, V y, V a, V b) {
    return _mm512_mask_mov_ps(b, _mm512_cmp_ps_mask(x, y, _CMP_EQ_OQ), a);
  }
  static V max_nan(V v, V old) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_max_ps(v, old), v);
  }
  template <StepElem G>
  static V load_grad(const void* p, std::int64_t i) {
    if constexpr (G == StepElem::f32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    const auto* h = reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i);
    if constexpr (G == StepElem::f16) return _mm512_cvtph_ps(_mm256_loadu_si256(h));
    if constexpr (G == StepElem::bf16) return bf16x16_to_float(_mm256_loadu_si256(h));
  }
  template <Out W>
  static __m256i to16(V x) {
    if constexpr (W == Out::f16) return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    if constexpr (W == Out::bf16) return float_to_bf16x16(x);
  }
  template <Out W>
  static void store_weight(void* p, std::int64_t i, V x, bool nt) {
    if constexpr (W == Out::f32) {
      float* f = static_cast<float*>(p) + i;
      nt ? _mm512_stream_ps(f, x) : _mm512_storeu_ps(f, x);
    } else if constexpr (W != Out::none) {
      auto* h = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(p) + i);
      nt ? _mm256_stream_si256(h, to16<W>(x)) : _mm256_storeu_si256(h, to16<W>(x));
    }
  }
  // Two vectors' 16-bit weights as one whole cache line (p + i 64-byte aligned), so that no
  // write-combining buffer leaves with half a line.
  template <Out W>
  static void stream_pair(void* p, std::int64_t i, V x0, V x1) {
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(to16<W>(x0)), to16<W>(x1), 1);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<std::uint16_t*>(p) + i), w);
  }
};
#endif
