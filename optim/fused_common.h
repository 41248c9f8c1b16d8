// What the fused optimizers share: the checks of a ScaledStep against the param groups, and the
// per-parameter view of a step. Internal.
#pragma once

#include <ampactor/kernels/fused_step.h>
#include <ampactor/optim/fused.h>

#include <array>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <unordered_map>
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
StateKey key_of(const void* impl);
/// The step's thread count.
int threads_of(const FusedOptions& o);
/// Whether the slot (and its state tensors) can take the fused loop: an fp32 master, everything
/// contiguous. Else the exact path of ATen ops runs.
bool fast(const Slot& s, std::initializer_list<at::Tensor> state);
/// The span of a fast slot; m, v, vmax filled by the caller.
kernels::StepSpan span_of(const Slot& s, int consts);
/// The exact path's gradient: in the master's dtype, times inv (the grad move's arithmetic).
at::Tensor unscaled(const Slot& s, float inv);

/// One parameter's second buffer, and what its pending speculative step read and ran with.
struct Shadow {
  at::Tensor p;                     // the second buffer's master (kept for reuse)
  std::array<at::Tensor, 3> state;  // and its state tensors (StateAccess's three)
  bool pending = false;             // holds a step not yet taken or dropped
  bool first = false;               // a first step: m, v, vmax are its new state, not a live one's
  std::int64_t step = 0;            // the step count after it (0: the kind keeps none)
  std::vector<double> inputs;       // what it read (see fingerprint) and its constants
};

/// Every parameter's shadow, by its master's TensorImpl.
struct Speculation {
  std::unordered_map<const void*, Shadow> shadows;
};

/// What a step of slot `s` reads besides its constants: the gradient, weight, master and state
/// tensors' data and versions (an in-place change in between bumps a version).
std::vector<double> fingerprint(const Slot& s, std::initializer_list<at::Tensor> state);
/// `t`, allocated like `like` (contiguous) when it is undefined.
float* buffer(at::Tensor& t, const at::Tensor& like);
/// The shadow of s's master when it holds a speculative step made from `inputs` and giving
/// step count `step`, else nullptr.
Shadow* matching(Speculation& spec, const Slot& s, const std::vector<double>& inputs,
                 std::int64_t step);
/// The shadow's master becomes the live one (a swap of storage; the master tensor stays).
void swap_master(const Slot& s, Shadow& sh);

}  // namespace ampactor::optim::detail
