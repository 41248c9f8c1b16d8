// What the fused optimizers share: the checks of a ScaledStep against the param groups, and the
// per-parameter view of a step. Internal.
#pragma once

#include <ampactor/kernels/fused_step.h>
#include <ampactor/optim/fused.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ampactor::optim::detail {

/// One parameter of a step.
struct Slot {
  at::Tensor p;       // the master
  at::Tensor grad;    // undefined: none this step
  at::Tensor weight;  // undefined: nothing to write
  std::size_t group = 0;
};

/// Checks `step` against the param groups (see ScaledStep) and pairs each parameter with its
/// gradient and weight. Throws ScalerError and changes nothing on bad input.
std::vector<Slot> collect(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                          const ScaledStep& step, const char* who);
/// Whether found_inf says to skip.
bool skipped(const ScaledStep& step);
/// The key torch::optim keeps a parameter's state under: the TensorImpl's address, printed in
/// LibTorch 1.x (a std::string), as is in 2.x (a void*).
using StateKey =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
StateKey key_of(const at::Tensor& p);
/// The step's thread count.
int threads_of(const FusedOptions& o);
/// Whether the slot (and its state tensors) can take the fused loop: an fp32 master, everything
/// contiguous. Else the exact path of ATen ops runs.
bool fast(const Slot& s, std::initializer_list<at::Tensor> state);
/// The span of a fast slot; m, v, vmax filled by the caller.
kernels::StepSpan span_of(const Slot& s, int consts);
/// The exact path's gradient: in the master's dtype, times inv (the grad move's arithmetic).
at::Tensor unscaled(const Slot& s, float inv);

}  // namespace ampactor::optim::detail
