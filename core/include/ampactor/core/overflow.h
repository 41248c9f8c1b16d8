// Which gradients overflowed in an iteration: the scalers' report, from the kernels' attribution
// (kernels::Measures::nonfinite). Torch-free: it travels in IterationDone.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ampactor {

/// One gradient that held inf or NaN.
struct OverflowTensor {
  std::string name;         // its parameter's name, or "param <index>" where not named
  std::uint64_t index = 0;  // the parameter's index in its optimizer (param-group order)
  bool inf = false, nan = false;
  /// The largest finite |gradient| of its neighbours in the optimizer (index - 1 and + 1), true
  /// size (divided by the scale), where they had gradients; NaN where none had.
  double neighbours_max = std::numeric_limits<double>::quiet_NaN();
};

/// What an iteration's overflow was.
struct OverflowReport {
  std::int64_t iteration = 0;           // the iteration (the first is 0)
  double scale = 0;                     // the scale the gradients were made at
  std::vector<OverflowTensor> tensors;  // by parameter index (then name, with several optimizers)
  /// Data parallel: the ranks whose own check found inf or NaN (empty without ranks).
  std::vector<std::int32_t> ranks = {};
  /// "iteration 7, scale 65536: fc1.weight held inf (its neighbours' largest finite |grad| ...)"
  std::string str() const;
};

}  // namespace ampactor
