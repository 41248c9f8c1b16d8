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

#include "fused_common.h"

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

// One step (speculative: into the second buffer, see FusedStep::speculate).
template <typename K, typename Map>
bool adam_step(std::vector<torch::optim::OptimizerParamGroup>& groups, Map& state,
               const ScaledStep& step, const FusedOptions& fused, const char* who,
               detail::Speculation& spec, bool speculative) {
  const std::vector<detail::Slot> slots = detail::collect(groups, step, who);
  if (detail::skipped(step)) return false;
  at::NoGradGuard no_grad;
  // LibTorch's Adam makes max_exp_avg_sq with the state only, so it cannot step a state made
  // before amsgrad was turned on either: refused before anything changes.
  for (std::size_t i = 0; i < slots.size() && !speculative; ++i) {
    const auto& o = static_cast<const typename K::O&>(groups[slots[i].group].options());
    auto it = state.find(detail::key_of(slots[i].p));
    if (slots[i].grad.defined() && o.amsgrad() && it != state.end() &&
        !static_cast<typename K::S*>(it->second.get())->max_exp_avg_sq().defined())
      throw ScalerError(errc::bad_option, std::string(who) + ": amsgrad is on, but parameter " +
                                              std::to_string(i) +
                                              "'s state was made without it (amsgrad turned on "
                                              "after its first step); nothing was stepped");
  }
  std::vector<kernels::StepSpan> spans;
  std::vector<kernels::AdamConsts> consts;
  for (const detail::Slot& s : slots) {
    if (!s.grad.defined()) {
      if (s.weight.defined() && !speculative) s.weight.copy_(s.p);
      continue;
    }
    const auto& o = static_cast<const typename K::O&>(groups[s.group].options());
    auto it = state.find(detail::key_of(s.p));
    auto* have = it == state.end() ? nullptr : static_cast<typename K::S*>(it->second.get());
    if (speculative && have && o.amsgrad() && !have->max_exp_avg_sq().defined())
      continue;  // the real step refuses it (above)
    const std::int64_t next = (have ? have->step() : 0) + 1;
    const bool is_fast = detail::fast(
        s, {have ? have->exp_avg() : at::Tensor(), have ? have->exp_avg_sq() : at::Tensor(),
            have ? have->max_exp_avg_sq() : at::Tensor()});
    if (speculative && !is_fast) continue;  // the exact path steps at step_scaled
    const kernels::AdamConsts c = adam_consts<K>(o, step.inv_scale(), next);
    if (!speculative && !have) {
      // A first step speculated: its state is the shadow's, installed only now.
      const auto in = adam_inputs(s, c, o.amsgrad(), {}, {}, {});
      if (detail::Shadow* sh = detail::matching(spec, s, in, next); sh && sh->first) {
        detail::swap_master(s, *sh);
        auto st = std::make_unique<typename K::S>();
        st->step(next);
        st->exp_avg(std::move(sh->m));  // the shadow makes new ones next time
        st->exp_avg_sq(std::move(sh->v));
        if (o.amsgrad()) st->max_exp_avg_sq(std::move(sh->vmax));
        state.emplace(detail::key_of(s.p), std::move(st));
        sh->pending = sh->first = false;
        continue;
      }
    }
    if (speculative && !have) {
      // A first step: from zero moments in the shadow's own buffers, stepped in place there, so
      // that no state enters the live optimizer (a save meanwhile would write it) before the
      // step is taken.
      detail::Shadow& sh = spec.shadows[s.p.unsafeGetTensorImpl()];
      kernels::StepSpan span = detail::span_of(s, int(consts.size()));
      span.param_out = detail::buffer(sh.p, s.p);
      for (at::Tensor* t : {&sh.m, &sh.v, &sh.vmax})
        if (t != &sh.vmax || o.amsgrad()) detail::buffer(*t, s.p), t->zero_();
      span.m = sh.m.template data_ptr<float>();
      span.v = sh.v.template data_ptr<float>();
      if (o.amsgrad()) span.vmax = sh.vmax.template data_ptr<float>();
      sh.inputs = adam_inputs(s, c, o.amsgrad(), {}, {}, {});
      sh.step = next;
      sh.pending = sh.first = true;
      consts.push_back(c);
      spans.push_back(span);
      continue;
    }
    if (!speculative && have) {
      const auto in = adam_inputs(s, c, o.amsgrad(), have->exp_avg(), have->exp_avg_sq(),
                                  have->max_exp_avg_sq());
      if (detail::Shadow* sh = detail::matching(spec, s, in, next)) {  // take it: swap
        detail::swap_master(s, *sh);
        detail::swap_state(
            sh->m, [&] { return have->exp_avg(); }, [&](auto t) { have->exp_avg(t); });
        detail::swap_state(
            sh->v, [&] { return have->exp_avg_sq(); }, [&](auto t) { have->exp_avg_sq(t); });
        if (o.amsgrad())
          detail::swap_state(
              sh->vmax, [&] { return have->max_exp_avg_sq(); },
              [&](auto t) { have->max_exp_avg_sq(t); });
        have->step(next);
        sh->pending = false;
        continue;
      }
    }
    if (!speculative) detail::supersede(spec, s);
    if (!have) {  // a real first step
      auto st = std::make_unique<typename K::S>();
      st->step(0);
      st->exp_avg(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      st->exp_avg_sq(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      if (o.amsgrad()) st->max_exp_avg_sq(at::zeros_like(s.p, at::MemoryFormat::Preserve));
      have = st.get();
      state.emplace(detail::key_of(s.p), std::move(st));
    }
    auto& st = *have;
    if (!is_fast) {  // not speculative (see above)
      st.step(next);
      const auto [b1, b2] = o.betas();
      adam_exact<K>(s, st, o, step.inv_scale(), 1 - std::pow(b1, next), 1 - std::pow(b2, next));
      continue;
    }
    kernels::StepSpan span = detail::span_of(s, int(consts.size()));
    span.m = st.exp_avg().template data_ptr<float>();
    span.v = st.exp_avg_sq().template data_ptr<float>();
    if (o.amsgrad()) span.vmax = st.max_exp_avg_sq().template data_ptr<float>();
    if (speculative) {
      detail::Shadow& sh = spec.shadows[s.p.unsafeGetTensorImpl()];
      span.param_out = detail::buffer(sh.p, s.p);
      span.m_out = detail::buffer(sh.m, st.exp_avg());
      span.v_out = detail::buffer(sh.v, st.exp_avg_sq());
      if (o.amsgrad()) span.vmax_out = detail::buffer(sh.vmax, st.max_exp_avg_sq());
      sh.inputs =
          adam_inputs(s, c, o.amsgrad(), st.exp_avg(), st.exp_avg_sq(), st.max_exp_avg_sq());
      sh.step = next;
      sh.pending = true;
      sh.first = false;
    } else {
      st.step(next);
    }
    consts.push_back(c);
    spans.push_back(span);
  }
  kernels::adam_step(spans, consts, detail::threads_of(fused));
  return true;
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
  const bool stepped =
      adam_step<AdamK>(param_groups_, state_, step, fused_, "FusedAdam", *spec_, false);
  drop_speculation();  // what was not taken
  return stepped;
}
void FusedAdam::speculate(const ScaledStep& step) {
  adam_step<AdamK>(param_groups_, state_, step, fused_, "FusedAdam", *spec_, true);
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
  const bool stepped =
      adam_step<AdamWK>(param_groups_, state_, step, fused_, "FusedAdamW", *spec_, false);
  drop_speculation();
  return stepped;
}
void FusedAdamW::speculate(const ScaledStep& step) {
  adam_step<AdamWK>(param_groups_, state_, step, fused_, "FusedAdamW", *spec_, true);
}
FusedAdamW::~FusedAdamW() {
  release();  // before any of it goes: a pipeline's queued steps may still use it
}
FusedStep* fused_step_of(torch::optim::Optimizer& opt) {
  return dynamic_cast<FusedStep*>(&opt);
}

}  // namespace ampactor::optim
