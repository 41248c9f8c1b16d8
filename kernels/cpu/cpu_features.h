// Run-time CPU dispatch: which loop variants can run here, and which one to pick.
#pragma once

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace ampactor::kernels::cpu {

inline bool has_avx2_f16c_fma() {
  __builtin_cpu_init();
  // clang's __builtin_cpu_supports knows no "f16c": read CPUID leaf 1 (ECX bit 29) for it. The
  // "avx2" check covers the OS's saving of the YMM registers, which F16C needs too.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/// The AVX-512 loops' needs: AVX2, F16C and FMA, AVX-512 F, BW, VL and DQ (CPUID leaf 7), and an
/// OS that saves the opmask and ZMM registers (XCR0 bits 1, 2 and 5 to 7, read with XGETBV where
/// CPUID says OSXSAVE). Read by hand: not every compiler's __builtin_cpu_supports knows these.
inline bool has_avx512() {
  if (!has_avx2_f16c_fma()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6u) != 0xe6u) return false;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned need = bit_AVX512F | bit_AVX512DQ | bit_AVX512BW | bit_AVX512VL;
  return (b & need) == need;
}

/// The loop variants, best last.
enum class Isa { baseline, avx2, avx512 };

/// The variant to run: the best this CPU has, capped by ATEN_CPU_CAPABILITY as LibTorch caps its
/// own kernels ("default": the baseline; "avx2": at most AVX2; anything else: no cap).
inline Isa pick_isa() {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  Isa limit = Isa::avx512;
  if (cap && std::strcmp(cap, "default") == 0) limit = Isa::baseline;
  if (cap && std::strcmp(cap, "avx2") == 0) limit = Isa::avx2;
  if (limit == Isa::avx512 && has_avx512()) return Isa::avx512;
  if (limit != Isa::baseline && has_avx2_f16c_fma()) return Isa::avx2;
  return Isa::baseline;
}

}  // namespace ampactor::kernels::cpu
