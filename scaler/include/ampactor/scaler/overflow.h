// Which gradients overflowed: the parameters' names, and the report (core/overflow.h) of an
// iteration whose unscale found inf or NaN, made from the step tracker's attribution.
#pragma once

#include <ampactor/core/overflow.h>

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampactor {

class StepTracker;

/// The parameters' names, by identity (the tensor the optimizers hold). Any thread may add and
/// read them (the trainer names, the optimizer's thread reports).
class ParameterNames {
 public:
  ParameterNames();
  ParameterNames(const ParameterNames& o);  // copies the names (a copied scaler keeps them)
  ParameterNames& operator=(const ParameterNames& o);
  ~ParameterNames();
  /// Adds every (name, parameter) of `named` (model->named_parameters()).
  void add(const torch::OrderedDict<std::string, at::Tensor>& named);
  void add(const std::string& name, const at::Tensor& parameter);
  /// The name of `parameter`, or "param <index>" (its index in its optimizer) when not named.
  std::string of(const at::Tensor& parameter, std::size_t index) const;

 private:
  struct Guarded;  // the names and their lock
  std::unique_ptr<Guarded> g_;
};

/// The gradients of `opt` that held inf or NaN in the iteration `tracker` records, by parameter
/// index: the attribution's flags (or, for a path that checked without them, its gradients
/// checked again) and the neighbours' gradients are read (device syncs): call it when found_inf
/// is set, while the gradients are as checked. Empty when `opt` found none.
std::vector<OverflowTensor> overflow_of(const StepTracker& tracker,
                                        const torch::optim::Optimizer& opt, double scale,
                                        const ParameterNames& names);
/// By parameter index, then name.
void sort_overflow(std::vector<OverflowTensor>& tensors);
/// overflow_of every optimizer the tracker recorded, as one report.
OverflowReport overflow_report(const StepTracker& tracker, double scale,
                               const ParameterNames& names, std::int64_t iteration);

}  // namespace ampactor
