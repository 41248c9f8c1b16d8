// The headers most suites include, precompiled once and shared by every suite
// (target_precompile_headers REUSE_FROM in tests/CMakeLists.txt): torch's, CAF's and doctest's
// cost seconds a file. glog's CHECK goes first and out of the way (doctest_torch.h).
#pragma once

#include "doctest_torch.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <caf/all.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
