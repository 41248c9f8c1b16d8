// FusedSGD: LibTorch 1.13's SGD step (torch/csrc/api/src/optim/sgd.cpp) in one pass per tensor:
//   d = g [+ wd * p];  buf = d (first step) or buf * momentum + (1 - dampening) * d;
//   d = nesterov ? d + momentum * buf : buf;  p = p - lr * d
// with every Scalar rounded to float as ATen rounds it.
#include <ATen/ops/clone.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>

#include "fused_common.h"

namespace ampactor::optim {
namespace {

// The exact path: torch's own ops, in torch's order. `buf` undefined: the first step.
void sgd_exact(const detail::Slot& s, const torch::optim::SGDOptions& o, float inv,
               torch::optim::SGDParamState* st, at::Tensor* fresh) {
  at::Tensor d = detail::unscaled(s, inv);
  if (o.weight_decay() != 0) d = d.add(s.p, o.weight_decay());
  if (o.momentum() != 0) {
    at::Tensor buf;
    if (!st) {
      buf = at::clone(d).detach();
      *fresh = buf;
    } else {
      buf = st->momentum_buffer();
      buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
    }
    d = o.nesterov() ? d.add(buf, o.momentum()) : buf;
  }
  s.p.add_(d, -1 * o.lr());
  if (s.weight.defined()) s.weight.copy_(s.p);
}

}  // namespace

FusedSGD::FusedSGD(std::vector<torch::optim::OptimizerParamGroup> groups,
                   torch::optim::SGDOptions defaults, FusedOptions fused)
    : torch::optim::SGD(std::move(groups), defaults), FusedStep(fused) {}
FusedSGD::FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults,
                   FusedOptions fused)
    : torch::optim::SGD(std::move(params), defaults), FusedStep(fused) {}

at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_scaled(ScaledStep());
  return loss;
}

namespace {

std::vector<double> sgd_inputs(const detail::Slot& s, const kernels::SgdConsts& c,
                               const at::Tensor& buf) {
  std::vector<double> in = detail::fingerprint(s, {buf});
  for (float x : {c.inv, c.wd, c.momentum, c.omdamp, c.neg_lr})
    in.push_back(double(x));
  in.push_back(c.l2), in.push_back(c.first), in.push_back(c.nesterov);
  return in;
}

// One step (speculative: into the second buffer, see FusedStep::speculate). SGD's state is its
// momentum buffer alone, made by the first step: a speculative first step makes it in the
// second buffer, and taking the step installs it.
bool sgd_step(std::vector<torch::optim::OptimizerParamGroup>& groups, torch::optim::Optimizer& opt,
              const ScaledStep& step, const FusedOptions& fused, detail::Speculation& spec,
              bool speculative) {
  auto& state = opt.state();
  const std::vector<detail::Slot> slots = detail::collect(groups, step, "FusedSGD");
  if (detail::skipped(step)) return false;
  at::NoGradGuard no_grad;
  std::vector<kernels::StepSpan> spans;
  std::vector<kernels::SgdConsts> consts;
  for (const detail::Slot& s : slots) {
    if (!s.grad.defined()) {
      if (s.weight.defined() && !speculative) s.weight.copy_(s.p);
      continue;
    }
    const auto& o = static_cast<const torch::optim::SGDOptions&>(groups[s.group].options());
    torch::optim::SGDParamState* st = nullptr;
    if (auto it = state.find(detail::key_of(s.p)); it != state.end())
      st = static_cast<torch::optim::SGDParamState*>(it->second.get());
    const bool first = o.momentum() != 0 && !st;
    const at::Tensor live_buf = st ? st->momentum_buffer() : at::Tensor();
    const bool is_fast = detail::fast(s, {live_buf});
    if (speculative && !is_fast) continue;  // the exact path steps at step_scaled
    kernels::SgdConsts c;
    c.inv = step.inv_scale();
    c.l2 = o.weight_decay() != 0;
    c.wd = float(o.weight_decay());
    c.momentum = float(o.momentum());
    c.omdamp = float(1 - o.dampening());
    c.neg_lr = float(-1 * o.lr());
    c.first = first;
    c.nesterov = o.nesterov();
    const std::vector<double> in = sgd_inputs(s, c, live_buf);
    if (!speculative) {
      if (detail::Shadow* sh = detail::matching(spec, s, in, 0)) {  // take it: swap
        detail::swap_master(s, *sh);
        if (first) {
          auto ps = std::make_unique<torch::optim::SGDParamState>();
          ps->momentum_buffer(std::move(sh->m));  // the shadow makes a new one next time
          state[detail::key_of(s.p)] = std::move(ps);
        } else if (o.momentum() != 0) {
          detail::swap_state(
              sh->m, [&] { return st->momentum_buffer(); },
              [&](auto t) { st->momentum_buffer(t); });
        }
        sh->pending = false;
        continue;
      }
      detail::supersede(spec, s);
    }
    at::Tensor fresh;  // the first step's momentum buffer
    if (!is_fast) {
      sgd_exact(s, o, step.inv_scale(), st, &fresh);
    } else {
      kernels::StepSpan span = detail::span_of(s, int(consts.size()));
      if (speculative) {
        detail::Shadow& sh = spec.shadows[s.p.unsafeGetTensorImpl()];
        span.param_out = detail::buffer(sh.p, s.p);
        if (o.momentum() != 0) {
          // First step: the new buffer is written in the shadow's, nothing live is read.
          span.m = first ? detail::buffer(sh.m, s.p) : live_buf.data_ptr<float>();
          if (!first) span.m_out = detail::buffer(sh.m, live_buf);
        }
        sh.inputs = in;
        sh.step = 0;
        sh.pending = true;
      } else {
        if (first) fresh = at::empty_like(s.p, at::MemoryFormat::Contiguous);
        if (o.momentum() != 0) span.m = (first ? fresh : live_buf).data_ptr<float>();
      }
      consts.push_back(c);
      spans.push_back(span);
    }
    if (first && !speculative) {
      auto ps = std::make_unique<torch::optim::SGDParamState>();
      ps->momentum_buffer(fresh);
      state[detail::key_of(s.p)] = std::move(ps);
    }
  }
  kernels::sgd_step(spans, consts, detail::threads_of(fused));
  return true;
}

}  // namespace

bool FusedSGD::step_scaled(const ScaledStep& step) {
  const bool stepped = sgd_step(param_groups_, *this, step, fused_, *spec_, false);
  drop_speculation();  // what was not taken
  return stepped;
}

void FusedSGD::speculate(const ScaledStep& step) {
  sgd_step(param_groups_, *this, step, fused_, *spec_, true);
}

FusedSGD::~FusedSGD() {
  release();  // before any of it goes: a pipeline's queued steps may still use it
}
}  // namespace ampactor::optim
