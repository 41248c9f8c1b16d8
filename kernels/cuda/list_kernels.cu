// Multi-tensor list kernels: fused unscale + non-finite check, check-only and the grad move.
// A launch takes a batch of spans in its kernel arguments (a __grid_constant__ struct, read in
// place); every block owns one chunk of one span, found by a binary search over the batch's chunk
// prefix sums, so a list of a thousand small tensors is one launch and a large tensor spreads over
// many blocks. Each thread keeps several 16-byte loads in flight; unaligned runs and tails take a
// scalar path. Non-finite is tested on the exponent bits, as the CPU loops do. On request the
// same pass also finds the largest finite |element| read (a separate instantiation, kMax).
// The per-thread loops over a chunk are in list_runs.cuh.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "elem_traits.cuh"
#include "launch.h"

namespace ampactor::kernels::gpu {
namespace {

constexpr int kThreads = 256;
// Elements per block: a multiple of every vector width, small enough that a mid-sized tensor
// still fills the device, large enough that a block's fixed cost stays small.
constexpr std::int64_t kChunk = 8192;
constexpr int kUnroll = 4;
// Two batch capacities: launches copy the whole argument struct, so short lists use a small one.
// The large one stays under the 32 KB kernel-argument limit (CUDA 12.1+, Volta and newer).
constexpr int kSmallBatch = 32;
constexpr int kLargeBatch = 1024;
constexpr int kTypeShift = 56;
// Keeps every tensor's chunk count, and a batch's, within an int.
constexpr std::int64_t kMaxNumel = std::int64_t(1) << 46;

template <int N, int P>
struct Batch {
  int count;
  int chunk_start[N + 1];  // prefix sums of chunks; block b works on the span t with
                           // chunk_start[t] <= b < chunk_start[t + 1]
  void* ptr[P][N];         // [0]: the gradient or the move's source, [1]: the move's destination
  std::uint64_t numel_type[N];  // numel | dtype << kTypeShift
  std::uint32_t slot_base;      // attribution: span t's flag is flags[slot_base + slot_off[t]]
  std::uint16_t slot_off[N];
};

static_assert(sizeof(Batch<kLargeBatch, 2>) + 64 < 32764, "kernel arguments over the limit");

#include "list_runs.cuh"

enum class Op { unscale, check, move };

/// What this thread's share of a chunk holds: 1 an inf, 2 a NaN (the attribution's second read,
/// in blocks that found one only).
template <typename T>
__device__ unsigned held_run(const typename T::Bits* p, int n) {
  using B = typename T::Bits;
  unsigned h = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const B b = p[i];
    if (T::bad(b)) h |= B(b << 1) == B(T::kExp << 1) ? 1u : 2u;  // the sign shifted out
  }
  return h;
}

__device__ unsigned held_chunk(DType t, const void* p, std::int64_t begin, int n) {
  switch (t) {
    case DType::f32:
      return held_run<F32>(static_cast<const F32::Bits*>(p) + begin, n);
    case DType::f64:
      return held_run<F64>(static_cast<const F64::Bits*>(p) + begin, n);
    case DType::f16:
      return held_run<F16>(static_cast<const F16::Bits*>(p) + begin, n);
    default:
      return held_run<BF16>(static_cast<const BF16::Bits*>(p) + begin, n);
  }
}

/// ORs v into the byte at p (an atomic on its aligned 32-bit word; little-endian).
__device__ void or_byte(unsigned char* p, unsigned v) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  atomicOr(reinterpret_cast<unsigned*>(a & ~std::uintptr_t(3)), v << (8 * (a & 3)));
}

template <typename T, Op kOp, bool kMax, int N, int P>
__device__ bool run_chunk(const Batch<N, P>& b, int t, std::int64_t begin, int n, float inv,
                          float* mx) {
  using B = typename T::Bits;
  using M = typename T::Math;
  if constexpr (kOp == Op::move) {
    return move_run<T, kMax>(static_cast<const B*>(b.ptr[0][t]) + begin,
                             static_cast<float*>(b.ptr[P - 1][t]) + begin, n, M(inv), mx);
  } else if constexpr (kOp == Op::unscale) {
    B* p = static_cast<B*>(b.ptr[0][t]) + begin;
    // An inverse scale of exactly 1 changes nothing: read only, as the CPU path does.
    return inv != 1.0f ? unscale_run<T, true, kMax>(p, n, M(inv), mx)
                       : unscale_run<T, false, kMax>(p, n, M(inv), mx);
  } else {
    return unscale_run<T, false, kMax>(static_cast<B*>(b.ptr[0][t]) + begin, n, M(1), mx);
  }
}

/// kMax: also raise *absmax to the block's largest finite |x| (a separate instantiation, so
/// launches without it keep their code and cost).
/// run_chunk for the chunk's dtype (one tensor's, uniform across the block).
template <Op kOp, bool kMax, int N, int P>
__device__ __forceinline__ bool run_typed(DType t, const Batch<N, P>& b, int lo, std::int64_t begin,
                                          int n, float inv, float* mx) {
  switch (t) {
    case DType::f32:
      return run_chunk<F32, kOp, kMax>(b, lo, begin, n, inv, mx);
    case DType::f64:
      return run_chunk<F64, kOp, kMax>(b, lo, begin, n, inv, mx);
    case DType::f16:
      return run_chunk<F16, kOp, kMax>(b, lo, begin, n, inv, mx);
    case DType::bf16:
      return run_chunk<BF16, kOp, kMax>(b, lo, begin, n, inv, mx);
  }
  return false;
}

template <int N, int P, Op kOp, bool kMax>
__global__ void __launch_bounds__(kThreads)
    list_kernel(const __grid_constant__ Batch<N, P> b, const float* inv_dev, float inv_value,
                float* found_inf, float* absmax, unsigned char* flags) {
  const int block = int(blockIdx.x);
  int lo = 0, hi = b.count;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (b.chunk_start[mid] <= block)
      lo = mid;
    else
      hi = mid;
  }
  const std::uint64_t nt = b.numel_type[lo];
  const std::int64_t numel = std::int64_t(nt & ((std::uint64_t(1) << kTypeShift) - 1));
  const std::int64_t begin = std::int64_t(block - b.chunk_start[lo]) * kChunk;
  const int n = int(numel - begin < kChunk ? numel - begin : kChunk);
  const float inv = kOp == Op::check ? 1.0f : (inv_dev ? *inv_dev : inv_value);
  float mx = 0.0f;  // this thread's largest finite |x| (kMax)
  const bool bad = run_typed<kOp, kMax>(DType(nt >> kTypeShift), b, lo, begin, n, inv, &mx);
  // Block max: shuffles within a warp (__reduce_max_sync needs sm_80; sm_75 is built too), then
  // one slot per warp, read after the barrier of __syncthreads_or. Non-negative floats order
  // like their bits, so the max and the atomic work on the uint32 bits.
  __shared__ unsigned warp_max[kThreads / 32];
  if constexpr (kMax) {
    unsigned m = __float_as_uint(mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      m = max_bits(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  }
  // Only ever set, never cleared: the caller pre-zeroes found_inf.
  const bool block_bad = __syncthreads_or(bad) != 0;
  if (block_bad && threadIdx.x == 0) *found_inf = 1.0f;
  if (flags && block_bad) {  // uniform across the block: every thread takes the barriers below
    const unsigned h = held_chunk(DType(nt >> kTypeShift), b.ptr[0][lo], begin, n);
    const bool inf = __syncthreads_or(h & 1u) != 0, nan = __syncthreads_or(h & 2u) != 0;
    if (threadIdx.x == 0)
      or_byte(flags + b.slot_base + b.slot_off[lo], (inf ? 1u : 0u) | (nan ? 2u : 0u));
  }
  if constexpr (kMax) {
    if (threadIdx.x == 0) {
      unsigned m = 0;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w)
        m = max_bits(m, warp_max[w]);
      // Likewise only ever raised (pre-zeroed); a block of zeros or non-finite values skips it.
      if (m > 0) atomicMax(reinterpret_cast<unsigned*>(absmax), m);
    }
  }
}

/// A non-empty span as the launch loop sees it.
struct Item {
  void* ptr[2];
  std::int64_t numel;
  DType dtype;
  std::uint32_t slot;  // attribution (0 without it)
};

bool valid_dtype(DType t) {
  return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::bf16);
}

template <int N, int P, Op kOp, bool kMax>
int launch_all(const std::vector<Item>& items, const float* inv_dev, float inv, float* found,
               float* absmax, unsigned char* flags, cudaStream_t stream) {
  Batch<N, P> b;
  std::size_t i = 0;
  while (i < items.size()) {
    b.count = 0;
    int chunks = 0;
    while (i < items.size() && b.count < N) {
      const Item& it = items[i];
      const std::int64_t c = (it.numel + kChunk - 1) / kChunk;
      if (b.count > 0 && chunks + c > INT_MAX) break;  // the rest goes into the next launch
      if (b.count == 0) b.slot_base = it.slot;
      if (it.slot - b.slot_base > 0xffffu) break;  // past a batch's slot offsets: the next launch
      b.slot_off[b.count] = std::uint16_t(it.slot - b.slot_base);
      b.chunk_start[b.count] = chunks;
      for (int p = 0; p < P; ++p)
        b.ptr[p][b.count] = it.ptr[p];
      b.numel_type[b.count] = std::uint64_t(it.numel) | (std::uint64_t(it.dtype) << kTypeShift);
      chunks += int(c);
      ++b.count;
      ++i;
    }
    b.chunk_start[b.count] = chunks;
    list_kernel<N, P, kOp, kMax>
        <<<unsigned(chunks), kThreads, 0, stream>>>(b, inv_dev, inv, found, absmax, flags);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  }
  return 0;
}

template <int P, Op kOp>
int launch(const std::vector<Item>& items, const float* inv_dev, float inv, float* found,
           float* absmax, unsigned char* flags, void* stream) {
  if (items.empty()) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool small = items.size() <= std::size_t(kSmallBatch);
  if (absmax)
    return small
               ? launch_all<kSmallBatch, P, kOp, true>(items, inv_dev, inv, found, absmax, flags, s)
               : launch_all<kLargeBatch, P, kOp, true>(items, inv_dev, inv, found, absmax, flags,
                                                       s);
  return small
             ? launch_all<kSmallBatch, P, kOp, false>(items, inv_dev, inv, found, nullptr, flags, s)
             : launch_all<kLargeBatch, P, kOp, false>(items, inv_dev, inv, found, nullptr, flags,
                                                      s);
}

/// The attribution's slots: each span's own, checked to be non-decreasing.
bool slots_ok(const Attribution& a, std::size_t count) {
  if (!a.flags_dev) return true;
  if (count > 0 && !a.slot_of) return false;
  for (std::size_t i = 1; i < count; ++i)
    if (a.slot_of[i] < a.slot_of[i - 1]) return false;
  return true;
}

/// Checks every span before anything is queued; empty spans are dropped.
bool collect(const Span* spans, std::size_t count, const Attribution& a, std::vector<Item>* items) {
  if ((count > 0 && !spans) || !slots_ok(a, count)) return false;
  items->reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Span& s = spans[i];
    if (s.numel < 0 || s.numel >= kMaxNumel || !valid_dtype(s.dtype)) return false;
    if (s.numel == 0) continue;
    if (!s.data) return false;
    items->push_back({{s.data, nullptr}, s.numel, s.dtype, a.flags_dev ? a.slot_of[i] : 0});
  }
  return true;
}

}  // namespace

int unscale_and_check(const Span* spans, std::size_t count, const float* inv_scale_dev,
                      float inv_scale_value, float* found_inf_dev, void* stream, float* absmax_dev,
                      Attribution attribution) {
  std::vector<Item> items;
  if (!found_inf_dev || !collect(spans, count, attribution, &items)) return kInvalidInput;
  return launch<1, Op::unscale>(items, inv_scale_dev, inv_scale_value, found_inf_dev, absmax_dev,
                                attribution.flags_dev, stream);
}

int check_finite(const Span* spans, std::size_t count, float* found_inf_dev, void* stream,
                 float* absmax_dev, Attribution attribution) {
  std::vector<Item> items;
  if (!found_inf_dev || !collect(spans, count, attribution, &items)) return kInvalidInput;
  return launch<1, Op::check>(items, nullptr, 1.0f, found_inf_dev, absmax_dev,
                              attribution.flags_dev, stream);
}

int move_grads_and_unscale(const MoveSpan* spans, std::size_t count, const float* inv_scale_dev,
                           float inv_scale_value, float* found_inf_dev, void* stream,
                           float* absmax_dev, Attribution attribution) {
  if (!found_inf_dev || (count > 0 && !spans) || !slots_ok(attribution, count))
    return kInvalidInput;
  std::vector<Item> items;
  items.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const MoveSpan& s = spans[i];
    if (s.numel < 0 || s.numel >= kMaxNumel || !valid_dtype(s.src_dtype)) return kInvalidInput;
    if (s.numel == 0) continue;
    if (!s.src || !s.dst) return kInvalidInput;
    items.push_back({{const_cast<void*>(s.src), s.dst},
                     s.numel,
                     s.src_dtype,
                     attribution.flags_dev ? attribution.slot_of[i] : 0});
  }
  return launch<2, Op::move>(items, inv_scale_dev, inv_scale_value, found_inf_dev, absmax_dev,
                             attribution.flags_dev, stream);
}

std::size_t max_spans_per_launch() {
  return kLargeBatch;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // "no driver" must not linger as the next launch's error
    return 0;
  }
  return n;
}

const char* error_string(int status) {
  if (status == kInvalidInput)
    return "invalid input (a null pointer, a negative or too large element count, or an unknown "
           "dtype)";
  return cudaGetErrorString(static_cast<cudaError_t>(status));
}

}  // namespace ampactor::kernels::gpu
