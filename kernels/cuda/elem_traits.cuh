// Element-type traits of the list kernels (list_kernels.cu), one per gradient dtype, and the
// bit-level helpers on them. Everything works on the bits, as the CPU loops do: correct under any
// floating-point mode, and the largest finite magnitude is an integer max. No torch headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ampactor::kernels::gpu {

// kExp: the exponent bits, all set exactly for inf and NaN. mag: a finite |x| (as bits) as a float,
// exact but for fp64, which rounds toward zero so that a finite double never becomes inf.
struct F32 {
  using Bits = std::uint32_t;
  using Math = float;
  static constexpr Bits kExp = 0x7f800000u;
  static __device__ bool bad(Bits b) { return (b & kExp) == kExp; }
  static __device__ float mag(Bits a) { return __uint_as_float(a); }
  static __device__ Math to_math(Bits b) { return __uint_as_float(b); }
  static __device__ Bits from_math(Math f) { return __float_as_uint(f); }
};
struct F64 {
  using Bits = unsigned long long;
  using Math = double;
  static constexpr Bits kExp = 0x7ff0000000000000ull;
  static __device__ bool bad(Bits b) { return (b & kExp) == kExp; }
  static __device__ float mag(Bits a) {
    return __double2float_rz(__longlong_as_double(static_cast<long long>(a)));
  }
  static __device__ Math to_math(Bits b) { return __longlong_as_double(static_cast<long long>(b)); }
  static __device__ Bits from_math(Math f) { return static_cast<Bits>(__double_as_longlong(f)); }
};
struct F16 {
  using Bits = unsigned short;
  using Math = float;
  static constexpr Bits kExp = 0x7c00u;
  static __device__ bool bad(Bits b) { return (b & kExp) == kExp; }
  static __device__ float mag(Bits a) { return __half2float(__ushort_as_half(a)); }
  static __device__ Math to_math(Bits b) { return __half2float(__ushort_as_half(b)); }
  static __device__ Bits from_math(Math f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct BF16 {
  using Bits = unsigned short;
  using Math = float;
  static constexpr Bits kExp = 0x7f80u;
  static __device__ bool bad(Bits b) { return (b & kExp) == kExp; }
  static __device__ float mag(Bits a) { return __bfloat162float(__ushort_as_bfloat16(a)); }
  static __device__ Math to_math(Bits b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
  static __device__ Bits from_math(Math f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

/// max() on raw bits of one width (CUDA's max has no 16-bit overload).
template <typename U>
__device__ U max_bits(U a, U b) {
  return a < b ? b : a;
}

/// |x| as bits (sign cleared), or 0 for inf and NaN: a select, no branch. Non-negative IEEE
/// values order like their bits, so an integer max over these is the largest finite magnitude.
template <typename T>
__device__ typename T::Bits fin_abs(typename T::Bits b) {
  using B = typename T::Bits;
  const B a = B(b & B(B(~B(0)) >> 1));
  return a < T::kExp ? a : B(0);
}

}  // namespace ampactor::kernels::gpu
