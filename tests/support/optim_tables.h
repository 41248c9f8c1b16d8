// The fused optimizer loop variants this CPU can run (tests call the loops' tables directly).
#pragma once

#include <doctest/doctest.h>

#include <vector>

#include "cpu_features.h"
#include "optim_loops.h"

inline std::vector<const ampactor::kernels::cpu::OptimLoopTable*> optim_tables() {
  namespace cpu = ampactor::kernels::cpu;
  std::vector<const cpu::OptimLoopTable*> out{&cpu::baseline_optim_loops()};
  if (cpu::has_avx2_f16c_fma())
    out.push_back(&cpu::avx2_optim_loops());
  else
    MESSAGE("this CPU has no AVX2/F16C/FMA: the AVX2 loops are not tested");
  if (cpu::has_avx512())
    out.push_back(&cpu::avx512_optim_loops());
  else
    MESSAGE("this CPU has no AVX-512 F/BW/VL/DQ: the AVX-512 loops are not tested");
  return out;
}
