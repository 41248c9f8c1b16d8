#include "fused_common.h"

#include <ampactor/core/errors.h>

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdint>
#include <sstream>

namespace ampactor {

// The ScaledStep and FusedOptions setters: a bad value changes nothing.
auto optim::FusedOptions::threads(int value) -> decltype(*this) {
  if (value < 0)
    throw ScalerError(errc::bad_option,
                      "FusedOptions::threads must be >= 0, got " + std::to_string(value));
  threads_ = value;
  return *this;
}

auto optim::ScaledStep::inv_scale(float value) -> decltype(*this) {
  if (!(std::isfinite(value) && value > 0))
    throw ScalerError(errc::bad_option,
                      "ScaledStep::inv_scale must be finite and > 0, got " + std::to_string(value));
  inv_scale_ = value;
  return *this;
}

namespace optim::detail {
namespace {

bool grad_dtype_ok(at::ScalarType g, at::ScalarType p) {
  return g == at::kFloat || g == at::kHalf || g == at::kBFloat16 ||
         (g == at::kDouble && p == at::kDouble);
}

std::string at_param(const char* who, const char* what, std::size_t i) {
  return std::string(who) + ": " + what + " " + std::to_string(i) + " ";
}

void check_grad(const Slot& s, std::size_t i, const char* who) {
  if (s.grad.is_sparse() || !s.grad.device().is_cpu() ||
      !grad_dtype_ok(s.grad.scalar_type(), s.p.scalar_type()))
    throw ScalerError(errc::invalid_gradients,
                      at_param(who, "gradient", i) +
                          "must be a dense CPU fp32, fp16 or bf16 "
                          "tensor, got " +
                          std::string(c10::toString(s.grad.scalar_type())));
  if (s.grad.sizes() != s.p.sizes())
    throw ScalerError(errc::invalid_gradients,
                      at_param(who, "gradient", i) + "does not have its parameter's shape");
}

// Sets s.weight to w unless w is the parameter itself (then the step writes it already).
void pair_weight(Slot& s, const at::Tensor& w, std::size_t i, const char* who) {
  if (!w.device().is_cpu() || !grad_dtype_ok(w.scalar_type(), s.p.scalar_type()))
    throw ScalerError(errc::bad_parameters, at_param(who, "weight", i) +
                                                "must be a CPU fp32, fp16 or bf16 tensor, got " +
                                                std::string(c10::toString(w.scalar_type())));
  if (w.sizes() != s.p.sizes())
    throw ScalerError(errc::bad_parameters,
                      at_param(who, "weight", i) + "does not have its parameter's shape");
  // An expanded weight (stride 0) cannot take one value per element: refused before any write,
  // as copy_ would refuse it only after the master was stepped.
  if (at::has_internal_overlap(w) == at::MemOverlap::Yes)
    throw ScalerError(errc::bad_parameters,
                      at_param(who, "weight", i) +
                          "has elements that share memory (an expanded tensor?): each element "
                          "needs its own");
  if (!w.is_same(s.p)) {
    if (w.is_alias_of(s.p) || (s.grad.defined() && w.is_alias_of(s.grad)))
      throw ScalerError(errc::bad_parameters, at_param(who, "weight", i) +
                                                  "shares memory with its parameter or gradient");
    s.weight = w;
  }
}

// Checks slot i's parameter, then pairs it with its gradient and weight, each checked in turn.
void pair_slot(Slot& s, std::size_t i, const ScaledStep& step, const char* who) {
  if (!s.p.device().is_cpu() ||
      !(s.p.scalar_type() == at::kFloat || s.p.scalar_type() == at::kDouble))
    throw ScalerError(errc::bad_parameters,
                      at_param(who, "parameter", i) +
                          "is not an fp32 or fp64 CPU tensor: fused optimizers step fp32 masters "
                          "(e.g. AsyncOptimizer::optim_parameters())");
  s.grad = step.grads().empty() ? s.p.grad() : step.grads()[i];
  if (s.grad.defined()) check_grad(s, i, who);
  if (!step.weights().empty() && step.weights()[i].defined())
    pair_weight(s, step.weights()[i], i, who);
}

}  // namespace

std::vector<Slot> collect(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                          const ScaledStep& step, const char* who) {
  std::vector<Slot> slots;
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (const at::Tensor& p : groups[g].params())
      slots.push_back({p, {}, {}, g});
  const std::size_t n = slots.size();
  auto count = [&](const std::vector<at::Tensor>& list, const char* what) {
    if (!list.empty() && list.size() != n)
      throw ScalerError(errc::bad_parameters, std::string(who) + ": " +
                                                  std::to_string(list.size()) + " " + what +
                                                  " for " + std::to_string(n) + " parameters");
  };
  count(step.grads(), "gradients");
  count(step.weights(), "weights");
  if (const at::Tensor& f = step.found_inf(); f.defined())
    if (f.numel() != 1 || f.scalar_type() != at::kFloat || !f.device().is_cpu())
      throw ScalerError(errc::bad_parameters,
                        std::string(who) + ": found_inf must be a 1-element fp32 CPU tensor");
  for (std::size_t i = 0; i < n; ++i)
    pair_slot(slots[i], i, step, who);
  return slots;
}

bool skipped(const ScaledStep& step) {
  return step.found_inf().defined() && step.found_inf().item<float>() != 0.0f;
}

namespace {

template <class Key>
Key key_for(void* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // as c10::guts::to_string printed it
    os << impl;
    return os.str();
  } else {
    return impl;
  }
}

}  // namespace

StateKey key_of(const at::Tensor& p) {
  return key_for<StateKey>(p.unsafeGetTensorImpl());
}

StateKey key_of(const void* impl) {
  return key_for<StateKey>(const_cast<void*>(impl));
}

}  // namespace optim::detail

torch::optim::OptimizerParamState* optim::param_state(torch::optim::Optimizer& opt,
                                                      const at::Tensor& p) {
  auto it = opt.state().find(detail::key_of(p));
  return it == opt.state().end() ? nullptr : it->second.get();
}

namespace optim::detail {

int threads_of(const FusedOptions& o) {
  return o.threads() > 0 ? o.threads() : at::get_num_threads();
}

bool fast(const Slot& s, std::initializer_list<at::Tensor> state) {
  if (s.p.scalar_type() != at::kFloat || !s.p.is_contiguous() || !s.grad.is_contiguous() ||
      s.grad.scalar_type() == at::kDouble)
    return false;
  if (s.weight.defined() && !s.weight.is_contiguous()) return false;
  for (const at::Tensor& t : state)
    if (t.defined() && !t.is_contiguous()) return false;
  return true;
}

namespace {
kernels::StepElem elem_of(at::ScalarType t) {
  return t == at::kHalf       ? kernels::StepElem::f16
         : t == at::kBFloat16 ? kernels::StepElem::bf16
                              : kernels::StepElem::f32;
}
}  // namespace

kernels::StepSpan span_of(const Slot& s, int consts) {
  kernels::StepSpan span;
  span.grad = s.grad.data_ptr();
  span.grad_type = elem_of(s.grad.scalar_type());
  span.param = s.p.data_ptr<float>();
  if (s.weight.defined()) {
    span.weight = s.weight.data_ptr();
    span.weight_type = elem_of(s.weight.scalar_type());
  }
  span.n = s.p.numel();
  span.consts = consts;
  return span;
}

at::Tensor unscaled(const Slot& s, float inv) {
  return s.grad.to(s.p.scalar_type()).mul(double(inv));
}

std::vector<double> fingerprint(const Slot& s, std::initializer_list<at::Tensor> state) {
  std::vector<double> out;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return out.push_back(-1);
    out.push_back(double(reinterpret_cast<std::uintptr_t>(t.data_ptr())));
    out.push_back(double(t._version()));
  };
  add(s.grad), add(s.p), add(s.weight);
  for (const at::Tensor& t : state)
    add(t);
  return out;
}

float* buffer(at::Tensor& t, const at::Tensor& like) {
  if (!t.defined()) t = at::empty(like.sizes(), like.options().requires_grad(false));
  return t.data_ptr<float>();
}

Shadow* matching(Speculation& spec, const Slot& s, const std::vector<double>& inputs,
                 std::int64_t step) {
  auto it = spec.shadows.find(s.p.unsafeGetTensorImpl());
  if (it == spec.shadows.end()) return nullptr;
  Shadow& sh = it->second;
  return sh.pending && sh.step == step && sh.inputs == inputs ? &sh : nullptr;
}

void swap_master(const Slot& s, Shadow& sh) {
  at::Tensor live = s.p.variable_data();
  at::Tensor master = s.p;  // shares the TensorImpl that optimizers and pipelines hold
  master.set_data(sh.p);
  sh.p = std::move(live);
}

}  // namespace optim::detail
}  // namespace ampactor

namespace ampactor::optim {

FusedStep::FusedStep(FusedOptions fused)
    : fused_(fused), spec_(std::make_unique<detail::Speculation>()) {}
FusedStep::~FusedStep() = default;

void FusedStep::release() noexcept {
  if (auto f = std::move(release_)) {
    release_ = nullptr;
    f();
  }
}

void FusedStep::drop_speculation() {
  for (auto& [impl, sh] : spec_->shadows) {
    if (!sh.pending) continue;
    sh.pending = sh.first = false;
  }
}

bool FusedStep::speculation_pending() const {
  for (const auto& [impl, sh] : spec_->shadows)
    if (sh.pending) return true;
  return false;
}

std::int64_t FusedStep::speculation_bytes() const {
  std::int64_t n = 0;
  for (const auto& [impl, sh] : spec_->shadows)
    for (const at::Tensor* t : {&sh.p, &sh.state[0], &sh.state[1], &sh.state[2]})
      if (t->defined()) n += std::int64_t(t->nbytes());
  return n;
}

}  // namespace ampactor::optim
