// The fused optimizers' speculative steps (FusedStep::speculate), written once for every kind:
// a step of the live masters and state into a second buffer (the shadow), and its taking by the
// next real step where its inputs match. Each kind is driven through a small accessor to its
// per-parameter state (StateAccess), so its own step (adam_step, sgd_step) knows nothing of
// speculation. Internal.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "fused_common.h"

namespace ampactor::optim::detail {

/// One fast parameter's step, planned from the live state as the real step would run it now.
template <typename C>
struct Planned {
  kernels::StepSpan span;  // the live master, grad and weight, and the live state (in place)
  C consts;
  std::vector<double> inputs;       // what it reads and its constants (a shadow's key)
  std::int64_t next = 0;            // the step count after it (0: the kind keeps none)
  bool first = false;               // the parameter has no state yet: this step makes it
  std::array<at::Tensor, 3> state;  // the live state tensors (undefined: unused, or none yet)
  std::array<bool, 3> uses{};       // which of the three the step reads and writes
};

/// What the speculation reads and sets of a fused optimizer's per-parameter state: up to three
/// state tensors (Adam: exp_avg, exp_avg_sq, max_exp_avg_sq; SGD: momentum_buffer) and a step
/// count.
template <typename C>
class StateAccess {
 public:
  virtual ~StateAccess() = default;
  /// s's fast step (s has a gradient), or nullopt where the real step takes the exact path or
  /// refuses it.
  virtual std::optional<Planned<C>> plan(const Slot& s) = 0;
  /// A first step taken: `shadow`'s state tensors (moved out) become s's new state.
  virtual void install(const Slot& s, const Planned<C>& pl, std::array<at::Tensor, 3>& shadow) = 0;
  /// A later step taken: the live state swapped with `shadow`'s, the step count set.
  virtual void swap_in(const Slot& s, const Planned<C>& pl, std::array<at::Tensor, 3>& shadow) = 0;
  /// The kind's kernel over the spans.
  virtual void run(const std::vector<kernels::StepSpan>& spans, const std::vector<C>& consts) = 0;
  /// Whether a new state starts from zeros (Adam's moments) rather than being written whole by
  /// the first step (SGD's momentum buffer).
  virtual bool zero_new_state() const = 0;
};

inline float*& state_in(kernels::StepSpan& s, std::size_t k) {
  return k == 0 ? s.m : k == 1 ? s.v : s.vmax;
}
inline float*& state_out(kernels::StepSpan& s, std::size_t k) {
  return k == 0 ? s.m_out : k == 1 ? s.v_out : s.vmax_out;
}

/// Each fast parameter with a gradient stepped into its shadow: the live master and state are
/// only read. A first step's new state is made in the shadow's own buffers and stepped in place
/// there, so that no state enters the live optimizer (a save meanwhile would write it) before
/// the step is taken.
template <typename C>
void speculate(const std::vector<Slot>& slots, StateAccess<C>& a, Speculation& spec) {
  std::vector<kernels::StepSpan> spans;
  std::vector<C> consts;
  for (const Slot& s : slots) {
    if (!s.grad.defined()) continue;
    std::optional<Planned<C>> pl = a.plan(s);
    if (!pl) continue;  // the exact path steps at step_scaled
    Shadow& sh = spec.shadows[s.p.unsafeGetTensorImpl()];
    kernels::StepSpan span = pl->span;
    span.consts = int(consts.size());
    span.param_out = buffer(sh.p, s.p);
    for (std::size_t k = 0; k < 3; ++k) {
      if (!pl->uses[k]) continue;
      if (!pl->first) {
        state_out(span, k) = buffer(sh.state[k], pl->state[k]);
        continue;
      }
      state_in(span, k) = buffer(sh.state[k], s.p);
      if (a.zero_new_state()) sh.state[k].zero_();
    }
    sh.inputs = std::move(pl->inputs);
    sh.step = pl->next;
    sh.pending = true;
    sh.first = pl->first;
    consts.push_back(pl->consts);
    spans.push_back(span);
  }
  a.run(spans, consts);
}

/// The real step's first part: each parameter whose shadow holds a step made from the inputs the
/// real step would read now takes it, by swapping buffers (no second pass). Returns which were
/// taken; the real step steps the others.
template <typename C>
std::vector<bool> take_speculated(const std::vector<Slot>& slots, StateAccess<C>& a,
                                  Speculation& spec) {
  std::vector<bool> taken(slots.size(), false);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (!s.grad.defined()) continue;
    const auto it = spec.shadows.find(s.p.unsafeGetTensorImpl());
    if (it == spec.shadows.end() || !it->second.pending) continue;
    const std::optional<Planned<C>> pl = a.plan(s);
    if (!pl) continue;
    Shadow* sh = matching(spec, s, pl->inputs, pl->next);
    if (!sh || sh->first != pl->first) continue;
    swap_master(s, *sh);
    if (pl->first)
      a.install(s, *pl, sh->state);  // the shadow makes new buffers next time
    else
      a.swap_in(s, *pl, sh->state);
    sh->pending = sh->first = false;
    taken[i] = true;
  }
  return taken;
}

}  // namespace ampactor::optim::detail
