// Bit-level helpers shared by every instruction-set variant of the loops: non-finite tests, the
// largest-finite-magnitude bits, and the 16-bit conversions. Included by loops_impl.h inside its
// per-variant anonymous namespace (internal linkage: see there).
// No include guard and no includes: included exactly once, inside that namespace.

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

// |x| as bits, or 0 for inf and NaN. Non-negative IEEE values order like their bits, so an
// integer max over these is the largest finite magnitude, with no float compare. Written as a
// mask, not `a < inf ? a : 0`: GCC 12 vectorises a max reduction of the former only.
inline std::uint32_t finite_abs32(std::uint32_t b) {
  const std::uint32_t a = b & 0x7fffffffu;
  return a & (0u - std::uint32_t(a < 0x7f800000u));
}
inline std::uint64_t finite_abs64(std::uint64_t b) {
  const std::uint64_t a = b & 0x7fffffffffffffffull;
  return a & (0ull - std::uint64_t(a < 0x7ff0000000000000ull));
}
inline std::uint16_t finite_abs16(std::uint16_t b, std::uint16_t exp_mask) {
  const std::uint16_t a = std::uint16_t(b & 0x7fffu);
  return std::uint16_t(a & (0u - std::uint16_t(a < exp_mask)));
}
template <typename U>
inline U umax(U a, U b) {  // not std::max: see loops_impl.h on inline functions of other libraries
  return a < b ? b : a;
}
// Raises *out to the float with these bits (a finite magnitude).
inline void raise_f32_bits(float* out, std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  if (f > *out) *out = f;
}
// A finite double's magnitude as a float rounded toward zero: never inf, never above it.
inline void raise_f64_bits(float* out, std::uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  float f = float(d);  // round to nearest (may be inf)
  if (double(f) > d) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    --u;  // the next float toward zero (from inf: the largest finite one)
    std::memcpy(&f, &u, 4);
  }
  if (f > *out) *out = f;
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
