// SKIP_WITHOUT_GPU() for the cases that need CUDA tensors: a CUDA device and a LibTorch with
// CUDA. Without them the case is reported skipped (a failure with AMPACTOR_REQUIRE_GPU set).
#pragma once

#include <torch/cuda.h>

#include "skip.h"

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    if (!torch::cuda::is_available())                                       \
      AMPACTOR_SKIP_NO_GPU("no CUDA device, or this LibTorch has no CUDA"); \
  } while (0)
