// FusedSGD: LibTorch 1.13's SGD step (torch/csrc/api/src/optim/sgd.cpp) in one pass per tensor:
//   d = g [+ wd * p];  buf = d (first step) or buf * momentum + (1 - dampening) * d;
//   d = nesterov ? d + momentum * buf : buf;  p = p - lr * d
// with every Scalar rounded to float as ATen rounds it.
#include <ATen/ops/clone.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>

#include "fused_common.h"
#include "speculation.h"

#include <type_traits>
#include <utility>

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

kernels::SgdConsts sgd_consts(const torch::optim::SGDOptions& o, float inv, bool first) {
  kernels::SgdConsts c;
  c.inv = inv;
  c.l2 = o.weight_decay() != 0;
  c.wd = float(o.weight_decay());
  c.momentum = float(o.momentum());
  c.omdamp = float(1 - o.dampening());
  c.neg_lr = float(-1 * o.lr());
  c.first = first;
  c.nesterov = o.nesterov();
  return c;
}

using State = std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

// SGD's state as the speculation sees it (speculation.h): its momentum buffer alone, made by the
// first step (a speculative first step makes it in the second buffer; taking it installs it).
class SgdAccess : public detail::StateAccess<kernels::SgdConsts> {
 public:
  SgdAccess(const std::vector<torch::optim::OptimizerParamGroup>& groups, State& state, float inv,
            const FusedOptions& fused)
      : groups_(groups), state_(state), inv_(inv), fused_(fused) {}

  const torch::optim::SGDOptions& options(const detail::Slot& s) const {
    return static_cast<const torch::optim::SGDOptions&>(groups_[s.group].options());
  }
  torch::optim::SGDParamState* have(const detail::Slot& s) const {
    auto it = state_.find(detail::key_of(s.p));
    return it == state_.end() ? nullptr
                              : static_cast<torch::optim::SGDParamState*>(it->second.get());
  }

  std::optional<detail::Planned<kernels::SgdConsts>> plan(const detail::Slot& s) override {
    const auto& o = options(s);
    torch::optim::SGDParamState* st = have(s);
    detail::Planned<kernels::SgdConsts> pl;
    pl.state[0] = st ? st->momentum_buffer() : at::Tensor();
    if (!detail::fast(s, {pl.state[0]})) return std::nullopt;
    pl.first = o.momentum() != 0 && !st;
    pl.consts = sgd_consts(o, inv_, pl.first);
    pl.inputs = sgd_inputs(s, pl.consts, pl.state[0]);
    pl.uses = {o.momentum() != 0, false, false};
    pl.span = detail::span_of(s, 0);
    if (pl.uses[0] && !pl.first) pl.span.m = pl.state[0].data_ptr<float>();
    return pl;
  }

  void install(const detail::Slot& s, const detail::Planned<kernels::SgdConsts>&,
               std::array<at::Tensor, 3>& shadow) override {
    auto ps = std::make_unique<torch::optim::SGDParamState>();
    ps->momentum_buffer(std::move(shadow[0]));
    state_[detail::key_of(s.p)] = std::move(ps);
  }

  void swap_in(const detail::Slot& s, const detail::Planned<kernels::SgdConsts>& pl,
               std::array<at::Tensor, 3>& shadow) override {
    if (!pl.uses[0]) return;
    torch::optim::SGDParamState& st = *have(s);
    st.momentum_buffer(std::exchange(shadow[0], st.momentum_buffer()));
  }

  void run(const std::vector<kernels::StepSpan>& spans,
           const std::vector<kernels::SgdConsts>& consts) override {
    kernels::sgd_step(spans, consts, detail::threads_of(fused_));
  }
  bool zero_new_state() const override { return false; }

 private:
  const std::vector<torch::optim::OptimizerParamGroup>& groups_;
  State& state_;
  float inv_;
  const FusedOptions& fused_;
};

// One real step: the speculated steps that match are taken, every other parameter is stepped.
bool sgd_step(std::vector<torch::optim::OptimizerParamGroup>& groups, torch::optim::Optimizer& opt,
              const ScaledStep& step, const FusedOptions& fused, detail::Speculation& spec) {
  const std::vector<detail::Slot> slots = detail::collect(groups, step, "FusedSGD");
  if (detail::skipped(step)) return false;
  at::NoGradGuard no_grad;
  SgdAccess access(groups, opt.state(), step.inv_scale(), fused);
  const std::vector<bool> taken = detail::take_speculated(slots, access, spec);
  std::vector<kernels::StepSpan> spans;
  std::vector<kernels::SgdConsts> consts;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const detail::Slot& s = slots[i];
    if (!s.grad.defined()) {
      if (s.weight.defined()) s.weight.copy_(s.p);
      continue;
    }
    if (taken[i]) continue;
    const auto& o = access.options(s);
    torch::optim::SGDParamState* st = access.have(s);
    const bool first = o.momentum() != 0 && !st;
    const at::Tensor live_buf = st ? st->momentum_buffer() : at::Tensor();
    at::Tensor fresh;  // the first step's momentum buffer
    if (!detail::fast(s, {live_buf})) {
      sgd_exact(s, o, step.inv_scale(), st, &fresh);
    } else {
      kernels::StepSpan span = detail::span_of(s, int(consts.size()));
      if (first) fresh = at::empty_like(s.p, at::MemoryFormat::Contiguous);
      if (o.momentum() != 0) span.m = (first ? fresh : live_buf).data_ptr<float>();
      consts.push_back(sgd_consts(o, step.inv_scale(), first));
      spans.push_back(span);
    }
    if (first) {
      auto ps = std::make_unique<torch::optim::SGDParamState>();
      ps->momentum_buffer(fresh);
      opt.state()[detail::key_of(s.p)] = std::move(ps);
    }
  }
  kernels::sgd_step(spans, consts, detail::threads_of(fused));
  return true;
}

}  // namespace

bool FusedSGD::step_scaled(const ScaledStep& step) {
  const bool stepped = sgd_step(param_groups_, *this, step, fused_, *spec_);
  drop_speculation();  // what was not taken
  return stepped;
}

void FusedSGD::speculate(const ScaledStep& step) {
  const std::vector<detail::Slot> slots = detail::collect(param_groups_, step, "FusedSGD");
  if (detail::skipped(step)) return;
  at::NoGradGuard no_grad;
  SgdAccess access(param_groups_, state(), step.inv_scale(), fused_);
  detail::speculate(slots, access, *spec_);
}

FusedSGD::~FusedSGD() {
  release();  // before any of it goes: a pipeline's queued steps may still use it
}
}  // namespace ampactor::optim
