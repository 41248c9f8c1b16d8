// Which gradients overflowed: the scalers' report of an iteration whose unscale found inf or NaN,
// from the kernels' attribution (kernels::Measures::nonfinite), with the parameters' names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace ampactor {

class StepTracker;

/// The parameters' names, by identity (the tensor the optimizers hold).
class ParameterNames {
 public:
  /// Adds every (name, parameter) of `named` (model->named_parameters()).
  void add(const torch::OrderedDict<std::string, at::Tensor>& named);
  void add(const std::string& name, const at::Tensor& parameter);
  /// The name of `parameter`, or "param <index>" (its index in its optimizer) when not named.
  std::string of(const at::Tensor& parameter, std::size_t index) const;
  bool empty() const { return names_.empty(); }

 private:
  std::unordered_map<const void*, std::string> names_;
};

/// One gradient that held inf or NaN.
struct OverflowTensor {
  std::string name;       // ParameterNames::of
  std::size_t index = 0;  // the parameter's index in its optimizer (param-group order)
  bool inf = false, nan = false;
  /// The largest finite |gradient| of its neighbours in the optimizer (index - 1 and + 1), true
  /// size (divided by the scale), where they had gradients; NaN where none had.
  double neighbours_max = std::numeric_limits<double>::quiet_NaN();
};

/// What an iteration's overflow was.
struct OverflowReport {
  std::int64_t iteration = 0;           // the update() that saw it (the first is 0)
  double scale = 0;                     // the scale the gradients were made at
  std::vector<OverflowTensor> tensors;  // by parameter index (then name, with several optimizers)
  /// "iteration 7, scale 65536: fc1.weight held inf (neighbours' largest finite |grad| 0.03), ..."
  std::string str() const;
};

/// The report of the iteration `tracker` recorded (before its reset): reads the attribution's
/// flags and the neighbours' gradients (device syncs; call it only when found_inf is set).
OverflowReport overflow_report(const StepTracker& tracker, double scale,
                               const ParameterNames& names, std::int64_t iteration);

}  // namespace ampactor
