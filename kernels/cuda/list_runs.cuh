// The per-thread loops of the list kernels (list_kernels.cu): in-place unscale or check of a
// chunk's share, and the grad move into fp32, each with its 16-byte vector path and scalar tail.
// Included by list_kernels.cu inside its anonymous namespace, after kThreads and kUnroll.
// No include guard and no includes: included exactly once, inside that namespace.
template <typename T>
union Vec {
  uint4 raw;
  typename T::Bits e[16 / sizeof(typename T::Bits)];
};

__device__ bool aligned16_d(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

/// In-place unscale (kWrite) or check of n elements; true when one is inf or NaN. With kMax,
/// *mx is set to the largest finite |x| this thread read, before the multiply.
template <typename T, bool kWrite, bool kMax>
__device__ bool unscale_run(typename T::Bits* p, int n, typename T::Math inv, float* mx) {
  using B = typename T::Bits;
  constexpr int V = 16 / sizeof(B);
  bool any = false;
  B m = 0;  // kept as bits of T: one conversion per run, not per element
  int tail = 0;
  if (aligned16_d(p)) {
    const int nv = n / V;
    uint4* pv = reinterpret_cast<uint4*>(p);
    for (int base = threadIdx.x; base < nv; base += kThreads * kUnroll) {
      Vec<T> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // all loads first: several in flight per thread
        const int i = base + u * kThreads;
        if (i < nv) v[u].raw = kWrite ? pv[i] : __ldg(pv + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i >= nv) break;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          any |= T::bad(v[u].e[j]);
          if (kMax) m = max_bits(m, fin_abs<T>(v[u].e[j]));
          if (kWrite) v[u].e[j] = T::from_math(T::to_math(v[u].e[j]) * inv);
        }
        if (kWrite) pv[i] = v[u].raw;
      }
    }
    tail = nv * V;
  }
  for (int i = tail + threadIdx.x; i < n; i += kThreads) {
    const B b = p[i];
    any |= T::bad(b);
    if (kMax) m = max_bits(m, fin_abs<T>(b));
    if (kWrite) p[i] = T::from_math(T::to_math(b) * inv);
  }
  if (kMax) *mx = T::mag(m);
  return any;
}

/// dst[i] = float(src[i] * inv) for n elements; true when a source element is inf or NaN.
/// kMax: as in unscale_run, over the sources.
template <typename T, bool kMax>
__device__ bool move_run(const typename T::Bits* src, float* dst, int n, typename T::Math inv,
                         float* mx) {
  using B = typename T::Bits;
  constexpr int V = 16 / sizeof(B);
  bool any = false;
  B m = 0;
  int tail = 0;
  if (aligned16_d(src) && aligned16_d(dst)) {
    const int nv = n / V;
    const uint4* sv = reinterpret_cast<const uint4*>(src);
    for (int base = threadIdx.x; base < nv; base += kThreads * kUnroll) {
      Vec<T> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < nv) v[u].raw = __ldg(sv + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i >= nv) break;
        float out[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          any |= T::bad(v[u].e[j]);
          if (kMax) m = max_bits(m, fin_abs<T>(v[u].e[j]));
          out[j] = static_cast<float>(T::to_math(v[u].e[j]) * inv);
        }
        if constexpr (V >= 4) {
          float4* d = reinterpret_cast<float4*>(dst) + std::int64_t(i) * (V / 4);
#pragma unroll
          for (int q = 0; q < V / 4; ++q)
            d[q] = make_float4(out[4 * q], out[4 * q + 1], out[4 * q + 2], out[4 * q + 3]);
        } else {
          reinterpret_cast<float2*>(dst)[i] = make_float2(out[0], out[1]);
        }
      }
    }
    tail = nv * V;
  }
  for (int i = tail + threadIdx.x; i < n; i += kThreads) {
    const B b = src[i];
    any |= T::bad(b);
    if (kMax) m = max_bits(m, fin_abs<T>(b));
    dst[i] = static_cast<float>(T::to_math(b) * inv);
  }
  if (kMax) *mx = T::mag(m);
  return any;
}
