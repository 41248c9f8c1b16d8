// Run-time CPU dispatch: whether the AVX2 loops (AVX2, F16C and FMA) can run here.
#pragma once

#include <cpuid.h>

namespace ampactor::kernels::cpu {

inline bool has_avx2_f16c_fma() {
  __builtin_cpu_init();
  // clang's __builtin_cpu_supports knows no "f16c": read CPUID leaf 1 (ECX bit 29) for it. The
  // "avx2" check covers the OS's saving of the YMM registers, which F16C needs too.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace ampactor::kernels::cpu
