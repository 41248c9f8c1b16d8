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

bool FusedSGD::step_scaled(const ScaledStep& step) {
  const std::vector<detail::Slot> slots = detail::collect(param_groups_, step, "FusedSGD");
  if (detail::skipped(step)) return false;
  at::NoGradGuard no_grad;
  std::vector<kernels::StepSpan> spans;
  std::vector<kernels::SgdConsts> consts;
  for (const detail::Slot& s : slots) {
    if (!s.grad.defined()) {
      if (s.weight.defined()) s.weight.copy_(s.p);
      continue;
    }
    const auto& o = static_cast<const torch::optim::SGDOptions&>(param_groups_[s.group].options());
    torch::optim::SGDParamState* st = nullptr;
    if (auto it = state_.find(detail::key_of(s.p)); it != state_.end())
      st = static_cast<torch::optim::SGDParamState*>(it->second.get());
    at::Tensor fresh;  // the first step's momentum buffer
    const bool first = o.momentum() != 0 && !st;
    if (!detail::fast(s, {st ? st->momentum_buffer() : at::Tensor()})) {
      sgd_exact(s, o, step.inv_scale(), st, &fresh);
    } else {
      if (first) fresh = at::empty_like(s.p, at::MemoryFormat::Contiguous);
      kernels::SgdConsts c;
      c.inv = step.inv_scale();
      c.l2 = o.weight_decay() != 0;
      c.wd = float(o.weight_decay());
      c.momentum = float(o.momentum());
      c.omdamp = float(1 - o.dampening());
      c.neg_lr = float(-1 * o.lr());
      c.first = first;
      c.nesterov = o.nesterov();
      kernels::StepSpan span = detail::span_of(s, int(consts.size()));
      if (o.momentum() != 0) span.m = (first ? fresh : st->momentum_buffer()).data_ptr<float>();
      consts.push_back(c);
      spans.push_back(span);
    }
    if (first) {
      auto ps = std::make_unique<torch::optim::SGDParamState>();
      ps->momentum_buffer(fresh);
      state_[detail::key_of(s.p)] = std::move(ps);
    }
  }
  kernels::sgd_step(spans, consts, detail::threads_of(fused_));
  return true;
}

}  // namespace ampactor::optim
