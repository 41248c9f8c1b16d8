// Building the same optimizer twice, torch::optim's and ampactor's fused one, over copies of the
// same masters; and comparing them bit for bit.
#pragma once

#include <ampactor/optim/fused.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fused_common.h"  // optim/: key_of
#include "tensor_helpers.h"

namespace ampactor::test {

enum class Kind { adam, adamw, sgd };

/// One optimizer configuration: a kind and its options, the same for both implementations.
struct OptConfig {
  Kind kind = Kind::adam;
  double lr = 1e-3, wd = 0, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  bool amsgrad = false;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  std::string name() const {
    const char* k = kind == Kind::adam ? "adam" : kind == Kind::adamw ? "adamw" : "sgd";
    return c10::str(k, " lr ", lr, " wd ", wd, " betas ", b1, ",", b2, " eps ", eps, " amsgrad ",
                    amsgrad, " momentum ", momentum, " dampening ", dampening, " nesterov ",
                    nesterov);
  }
};

inline const std::vector<OptConfig>& configs() {
  static const std::vector<OptConfig> all = [] {
    std::vector<OptConfig> v;
    for (Kind k : {Kind::adam, Kind::adamw}) {
      OptConfig a{k};
      v.push_back(a);
      a.lr = 3e-3, a.wd = 0.1, a.b1 = 0.8, a.b2 = 0.99, a.eps = 1e-6;
      v.push_back(a);
      a.amsgrad = true, a.wd = 0.01;
      v.push_back(a);
    }
    OptConfig s{Kind::sgd};
    s.lr = 0.1;
    v.push_back(s);
    s.momentum = 0.9;
    v.push_back(s);
    s.dampening = 0.1, s.wd = 1e-2;
    v.push_back(s);
    s.dampening = 0, s.nesterov = true;
    v.push_back(s);
    return v;
  }();
  return all;
}

/// Two param groups (the second at half the learning rate) over `params`, as `fused` or torch's.
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptConfig& c,
                                                               const std::vector<at::Tensor>& ps,
                                                               bool fused, int threads = 1) {
  using namespace torch::optim;
  const std::size_t half = ps.size() / 2;
  const std::vector<at::Tensor> a(ps.begin(), ps.begin() + half), b(ps.begin() + half, ps.end());
  const auto fo = optim::FusedOptions().threads(threads);
  auto groups = [&](const auto& defaults) {
    auto second = defaults;
    second.lr(c.lr / 2);
    return std::vector<OptimizerParamGroup>{
        OptimizerParamGroup(a),
        OptimizerParamGroup(b, std::make_unique<std::decay_t<decltype(defaults)>>(second))};
  };
  if (c.kind == Kind::sgd) {
    auto o = SGDOptions(c.lr)
                 .momentum(c.momentum)
                 .dampening(c.dampening)
                 .weight_decay(c.wd)
                 .nesterov(c.nesterov);
    if (fused) return std::make_unique<optim::FusedSGD>(groups(o), o, fo);
    return std::make_unique<SGD>(groups(o), o);
  }
  if (c.kind == Kind::adam) {
    auto o = AdamOptions(c.lr).betas({c.b1, c.b2}).eps(c.eps).weight_decay(c.wd).amsgrad(c.amsgrad);
    if (fused) return std::make_unique<optim::FusedAdam>(groups(o), o, fo);
    return std::make_unique<Adam>(groups(o), o);
  }
  auto o = AdamWOptions(c.lr).betas({c.b1, c.b2}).eps(c.eps).weight_decay(c.wd).amsgrad(c.amsgrad);
  if (fused) return std::make_unique<optim::FusedAdamW>(groups(o), o, fo);
  return std::make_unique<AdamW>(groups(o), o);
}

/// Same dtype, shape and bits (NaN payloads and signed zeros included).
inline bool bits_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

/// The state tensors and step counts of `p` in `opt`, as one list (the step count as a tensor).
inline std::vector<at::Tensor> state_of(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto it = opt.state().find(optim::detail::key_of(p));
  if (it == opt.state().end()) return {};
  using namespace torch::optim;
  if (auto* s = dynamic_cast<SGDParamState*>(it->second.get())) return {s->momentum_buffer()};
  if (auto* s = dynamic_cast<AdamParamState*>(it->second.get()))
    return {s->exp_avg(), s->exp_avg_sq(),
            s->max_exp_avg_sq().defined() ? s->max_exp_avg_sq() : at::zeros({0}),
            at::full({1}, double(s->step()), at::kDouble)};
  if (auto* s = dynamic_cast<AdamWParamState*>(it->second.get()))
    return {s->exp_avg(), s->exp_avg_sq(),
            s->max_exp_avg_sq().defined() ? s->max_exp_avg_sq() : at::zeros({0}),
            at::full({1}, double(s->step()), at::kDouble)};
  return {};
}

/// Ulps (ulps_apart) by which the fused `c` may differ from torch::optim's after `steps` steps:
/// 0 (bit for bit) but for Adam and AdamW against LibTorch 2.x (kTorchSqrtRounded). There each
/// step's sqrt may be an ulp off, which moves that step's update by about an ulp of the update;
/// the masters, the moments (weight decay feeds the masters back into them) and the weights
/// stay within one ulp of their largest values per step taken (measured against torch 2.15: at
/// most 0.48 after 4 steps; the H100's LibTorch 2.11 stayed within it).
inline double allowed_ulps(const OptConfig& c, int steps) {
  return kTorchSqrtRounded || c.kind == Kind::sgd ? 0 : steps;
}

/// Whether a and b agree: bit for bit (NaN where the other has NaN, with `nan_ok`) when `ulps`
/// is 0, else within `ulps` (ulps_apart) and NaN in the same places; infinities must match.
inline bool agree(const at::Tensor& a, const at::Tensor& b, bool nan_ok, double ulps) {
  if (ulps == 0 || a.scalar_type() == at::kDouble)
    return nan_ok ? same_values(a, b) : bits_equal(a, b);
  const at::Tensor inf_a = at::isinf(a), inf_b = at::isinf(b);
  if (!at::equal(inf_a, inf_b) || !at::equal(a.masked_select(inf_a), b.masked_select(inf_b)))
    return false;
  const double d = ulps_apart(a, b);
  return d >= 0 && d <= ulps;
}

/// Whether two optimizers over equal parameters hold equal state (agree()).
inline bool same_state(torch::optim::Optimizer& a, const std::vector<at::Tensor>& pa,
                       torch::optim::Optimizer& b, const std::vector<at::Tensor>& pb,
                       bool nan_ok = false, double ulps = 0) {
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto sa = state_of(a, pa[i]), sb = state_of(b, pb[i]);
    if (sa.size() != sb.size()) return false;
    for (std::size_t k = 0; k < sa.size(); ++k)
      if (!agree(sa[k], sb[k], nan_ok, ulps)) return false;
  }
  return true;
}

}  // namespace ampactor::test
