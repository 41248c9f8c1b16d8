// FusedAdam and FusedAdamW: LibTorch 1.13's Adam and AdamW steps (torch/csrc/api/src/optim/
// adam.cpp, adamw.cpp) in one pass per tensor. The per-element sequence is theirs:
//   AdamW: p *= 1 - lr * wd;  Adam: g = g + wd * p
//   m = m * b1 + (1 - b1) * g;  v = v * b2 + (1 - b2) * g * g;  [vmax = max(vmax, v)]
//   p = p + (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// with every Scalar rounded to float as ATen rounds it, and bc1 = 1 - b1^step, bc2 = 1 - b2^step
// in double.
#include <ampactor/core/errors.h>

#include <ATen/ops/max.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <utility>

#include "fused_common.h"
#include "speculation.h"

namespace ampactor::optim {
namespace {

template <typename Options, typename State, bool kDecoupled>
struct AdamKind {
  using O = Options;
  using S = State;
  static constexpr bool decoupled = kDecoupled;
};
using AdamK = AdamKind<torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
using AdamWK = AdamKind<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

// The exact path (a non-contiguous or fp64 master): torch's own ops, in torch's order.
template <typename K>
void adam_exact(const detail::Slot& s, typename K::S& st, const typename K::O& o, float inv,
                double bc1, double bc2) {
  at::Tensor g = detail::unscaled(s, inv);
  at::Tensor p = s.p;
  if (o.weight_decay() != 0) {
    if (K::decoupled)
      p.mul_(1 - o.lr() * o.weight_decay());
    else
      g = g.add(p, o.weight_decay());
  }
  const auto [b1, b2] = o.betas();
  st.exp_avg().mul_(b1).add_(g, 1 - b1);
  st.exp_avg_sq().mul_(b2).addcmul_(g, g, 1 - b2);
  at::Tensor denom;
  if (o.amsgrad()) {
    at::max_out(st.max_exp_avg_sq(), st.exp_avg_sq(), st.max_exp_avg_sq());
    denom = (st.max_exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(o.eps());
  } else {
    denom = (st.exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(o.eps());
  }
  p.addcdiv_(st.exp_avg(), denom, -(o.lr() / bc1));
  if (s.weight.defined()) s.weight.copy_(p);
}

// The constants of one parameter's step.
template <typename K>
kernels::AdamConsts adam_consts(const typename K::O& o, float inv, std::int64_t step) {
  const auto [b1, b2] = o.betas();
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  kernels::AdamConsts c;
  c.inv = inv;
  c.l2 = !K::decoupled && o.weight_decay() != 0;
  c.decoupled = K::decoupled && o.weight_decay() != 0;
  c.wd = float(o.weight_decay());
  c.decay = float(1 - o.lr() * o.weight_decay());
  c.b1 = float(b1), c.omb1 = float(1 - b1), c.b2 = float(b2), c.omb2 = float(1 - b2);
  c.sqrt_bc2 = float(std::sqrt(bc2));
  c.eps = float(o.eps());
  c.neg_step = float(-(o.lr() / bc1));
  return c;
}

// What a speculative step read and ran with, to tell whether the real one would be the same.
// Every option the step reads is here, through its constants or itself (amsgrad).
std::vector<double> adam_inputs(const detail::Slot& s, const kernels::AdamConsts& c, bool amsgrad,
                                const at::Tensor& m, const at::Tensor& v, const at::Tensor& vmax) {
  std::vector<double> in = detail::fingerprint(s, {m, v, vmax});
  for (float x : {c.inv, c.wd, c.decay, c.b1, c.omb1, c.b2, c.omb2, c.sqrt_bc2, c.eps, c.neg_step})
    in.push_back(double(x));
  in.push_back(c.l2), in.push_back(c.decoupled), in.push_back(amsgrad);
  return in;
}

template <typename K>
const typename K::O& options_of(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                const detail::Slot& s) {
  return static_cast<const typename K::O&>(groups[s.group].options());
}

// Adam's state as the speculation sees it (speculation.h): the moments and the step count.
template <typename K, typename Map>
class AdamAccess : public detail::StateAccess<kernels::AdamConsts> {
 public:
  AdamAccess(const std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state, float inv,
             const FusedOptions& fused)
      : groups_(groups), state_(state), inv_(inv), fused_(fused) {}

  typename K::S* have(const detail::Slot& s) const {
    auto it = state_.find(detail::key_of(s.p));
    return it == state_.end() ? nullptr : static_cast<typename K::S*>(it->second.get());
  }

  std::optional<detail::Planned<kernels::AdamConsts>> plan(const detail::Slot& s) override {
    const auto& o = options_of<K>(groups_, s);
    typename K::S* st = have(s);
    if (st && o.amsgrad() && !st->max_exp_avg_sq().defined()) return std::nullopt;  // refused
    detail::Planned<kernels::AdamConsts> pl;
    if (st) pl.state = {st->exp_avg(), st->exp_avg_sq(), st->max_exp_avg_sq()};
    if (!detail::fast(s, {pl.state[0], pl.state[1], pl.state[2]})) return std::nullopt;
    pl.next = (st ? st->step() : 0) + 1;
    pl.first = !st;
    pl.consts = adam_consts<K>(o, inv_, pl.next);
    pl.inputs = adam_inputs(s, pl.consts, o.amsgrad(), pl.state[0], pl.state[1], pl.state[2]);
    pl.uses = {true, true, o.amsgrad()};
    pl.span = detail::span_of(s, 0);
    for (std::size_t k = 0; k < 3 && st; ++k)
      if (pl.uses[k]) detail::state_in(pl.span, k) = pl.state[k].template data_ptr<float>();
    return pl;
  }

  void install(const detail::Slot& s, const detail::Planned<kernels::AdamConsts>& pl,
               std::array<at::Tensor, 3>& shadow) override {
    auto st = std::make_unique<typename K::S>();
    st->step(pl.next);
    st->exp_avg(std::move(shadow[0]));
    st->exp_avg_sq(std::move(shadow[1]));
    if (pl.uses[2]) st->max_exp_avg_sq(std::move(shadow[2]));
    state_.emplace(detail::key_of(s.p), std::move(st));
  }

  void swap_in(const detail::Slot& s, const detail::Planned<kernels::AdamConsts>& pl,
               std::array<at::Tensor, 3>& shadow) override {
    typename K::S& st = *have(s);
    st.exp_avg(std::exchange(shadow[0], st.exp_avg()));
    st.exp_avg_sq(std::exchange(shadow[1], st.exp_avg_sq()));
    if (pl.uses[2]) st.max_exp_avg_sq(std::exchange(shadow[2], st.max_exp_avg_sq()));
    st.step(pl.next);
  }

  void run(const std::vector<kernels::StepSpan>& spans,
           const std::vector<kernels::AdamConsts>& consts) override {
    kernels::adam_step(spans, consts, detail::threads_of(fused_));
  }
  bool zero_new_state() const override { return true; }

 private:
  const std::vector<torch::optim::OptimizerParamGroup>& groups_;
  Map& state_;
  float inv_;
  const FusedOptions& fused_;
};

// LibTorch's Adam makes max_exp_avg_sq with the state only, so it cannot step a state made
// before amsgrad was turned on either: refused before anything changes.
template <typename K, typename Map>
void refuse_late_amsgrad(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                         const std::vector<detail::Slot>& slots, AdamAccess<K, Map>& access,
                         const char* who) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const typename K::S* st = access.have(slots[i]);
    if (slots[i].grad.defined() && options_of<K>(groups, slots[i]).amsgrad() && st &&
        !st->max_exp_avg_sq().defined())
      throw ScalerError(errc::bad_option, std::string(who) + ": amsgrad is on, but parameter " +
                                              std::to_string(i) +
                                              "'s state was made without it (amsgrad turned on "
                                              "after its first step); nothing was stepped");
  }
}

// One real step: the speculated steps that match are taken, every other parameter is stepped.
template <typename K, typename Map>
bool adam_step(std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state,
               const ScaledStep& step, const FusedOptions& fused, const char* who,
               detail::Speculation& spec) {
  const std::vector<detail::Slot> slots = detail::collect(groups, step, who);
  if (detail::skipped(step)) return false;
  at::NoGradGuard no_grad;
  AdamAccess<K, Map> access(groups, state, step.inv_scale(), fused);
  refuse_late_amsgrad(groups, slots, access, who);
  const std::vector<bool> taken = detail::take_speculated(slots, access, spec);
  std::vector<kernels::StepSpan> spans;
  std::vector<kernels::AdamConsts> consts;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const detail::Slot& s = slots[i];
    if (!s.grad.defined()) {
      if (s.weight.defined()) s.weight.copy_(s.p);
      continue;
    }
    if (taken[i]) continue;
    const auto& o = options_of<K>(groups, s);
    typename K::S* have = access.have(s);
    const std::int64_t next = (have ? have->step() : 0) + 1;
    const bool is_fast = detail::fast(
        s, {have ? have->exp_avg() : at::Tensor(), have ? have->exp_avg_sq() : at::Tensor(),
            have ? have->max_exp_avg_sq() : at::Tensor()});
    if (!have) {  // a first step
      auto st = std::make_unique<typename K::S>();
      st->step(0);
      st->exp_avg(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      st->exp_avg_sq(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      if (o.amsgrad()) st->max_exp_avg_sq(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      have = st.get();
      state.emplace(detail::key_of(s.p), std::move(st));
    }
    have->step(next);
    if (!is_fast) {
      const auto [b1, b2] = o.betas();
      adam_exact<K>(s, *have, o, step.inv_scale(), 1 - std::pow(b1, next), 1 - std::pow(b2, next));
      continue;
    }
    kernels::StepSpan span = detail::span_of(s, int(consts.size()));
    span.m = have->exp_avg().template data_ptr<float>();
    span.v = have->exp_avg_sq().template data_ptr<float>();
    if (o.amsgrad()) span.vmax = have->max_exp_avg_sq().template data_ptr<float>();
    consts.push_back(adam_consts<K>(o, step.inv_scale(), next));
    spans.push_back(span);
  }
  kernels::adam_step(spans, consts, detail::threads_of(fused));
  return true;
}

// A speculative step (FusedStep::speculate).
template <typename K, typename Map>
void adam_speculate(std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state,
                    const ScaledStep& step, const FusedOptions& fused, const char* who,
                    detail::Speculation& spec) {
  const std::vector<detail::Slot> slots = detail::collect(groups, step, who);
  if (detail::skipped(step)) return;
  at::NoGradGuard no_grad;
  AdamAccess<K, Map> access(groups, state, step.inv_scale(), fused);
  detail::speculate(slots, access, spec);
}

at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> groups,
                     torch::optim::AdamOptions defaults, FusedOptions fused)
    : torch::optim::Adam(std::move(groups), defaults), FusedStep(fused) {}
FusedAdam::FusedAdam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults,
                     FusedOptions fused)
    : torch::optim::Adam(std::move(params), defaults), FusedStep(fused) {}

at::Tensor FusedAdam::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  step_scaled(ScaledStep());
  return loss;
}
bool FusedAdam::step_scaled(const ScaledStep& step) {
  const bool stepped = adam_step<AdamK>(param_groups_, state_, step, fused_, "FusedAdam", *spec_);
  drop_speculation();  // what was not taken
  return stepped;
}
void FusedAdam::speculate(const ScaledStep& step) {
  adam_speculate<AdamK>(param_groups_, state_, step, fused_, "FusedAdam", *spec_);
}
FusedAdam::~FusedAdam() {
  release();  // before any of it goes: a pipeline's queued steps may still use it
}
FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                       torch::optim::AdamWOptions defaults, FusedOptions fused)
    : torch::optim::AdamW(std::move(groups), defaults), FusedStep(fused) {}
FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults,
                       FusedOptions fused)
    : torch::optim::AdamW(std::move(params), defaults), FusedStep(fused) {}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  step_scaled(ScaledStep());
  return loss;
}
bool FusedAdamW::step_scaled(const ScaledStep& step) {
  const bool stepped = adam_step<AdamWK>(param_groups_, state_, step, fused_, "FusedAdamW", *spec_);
  drop_speculation();
  return stepped;
}
void FusedAdamW::speculate(const ScaledStep& step) {
  adam_speculate<AdamWK>(param_groups_, state_, step, fused_, "FusedAdamW", *spec_);
}
FusedAdamW::~FusedAdamW() {
  release();  // before any of it goes: a pipeline's queued steps may still use it
}
FusedStep* fused_step_of(torch::optim::Optimizer& opt) {
  return dynamic_cast<FusedStep*>(&opt);
}

}  // namespace ampactor::optim
