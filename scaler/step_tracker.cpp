#include <ampactor/core/errors.h>
#include <ampactor/kernels/unscale.h>
#include <ampactor/optim/fused.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>
#include <ampactor/scaler/step_tracker.h>

#include "measure.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/optimizer.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <limits>
#include <string>

namespace ampactor {

using detail::measure_mixed;
using detail::unscale_measured;
using detail::zero_on;

bool OptimizerRecord::any_found_inf() const {
  for (const auto& [device, t] : found_inf_per_device)
    if (t.item<float>() != 0.0f) return true;
  return false;
}

double dtype_max_of(c10::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return 65504.0;
    case at::kBFloat16:
      return double(std::numeric_limits<c10::BFloat16>::max());
    case at::kFloat:
      return double(std::numeric_limits<float>::max());
    case at::kDouble:
      return std::numeric_limits<double>::max();
    default:
      return 0;
  }
}

GradSize OptimizerRecord::grad_size() const {
  if (agreed) return agreed_size;
  GradSize best;
  for (const auto& [dtype_max, t] : absmax) {
    const double m = t.item<float>();
    if (best.dtype_max == 0 || m / dtype_max > best.max / best.dtype_max) best = {m, dtype_max};
  }
  return best;
}

namespace detail {

at::Tensor zero_on(c10::Device device) {
  return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

/// Groups a list by dtype so that each gets its own grad_absmax: a size is only comparable with
/// its own dtype's largest value.
std::vector<std::pair<c10::ScalarType, std::vector<std::size_t>>> by_dtype(
    const std::vector<at::Tensor>& ts) {
  std::vector<std::pair<c10::ScalarType, std::vector<std::size_t>>> out;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto& e) { return e.first == ts[i].scalar_type(); });
    if (it == out.end()) it = out.insert(out.end(), {ts[i].scalar_type(), {}});
    it->second.push_back(i);
  }
  return out;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<std::size_t>& i) {
  std::vector<at::Tensor> out;
  out.reserve(i.size());
  for (std::size_t j : i)
    out.push_back(ts[j]);
  return out;
}

/// The flags of one kernel call over `n` gradients, and their positions 0..n-1 in its list.
Attributed whole_list(std::size_t n, c10::Device device) {
  Attributed a;
  a.flags = at::zeros({std::int64_t(n)}, at::TensorOptions().dtype(at::kByte).device(device));
  for (std::size_t i = 0; i < n; ++i)
    a.params.push_back(i);
  return a;
}

/// Measures a list that mixes dtypes: a read-only pass per dtype, before the one call that checks
/// and writes the whole list (so a refusal still changes nothing). One dtype: nothing to do here,
/// the single call measures. Returns whether it measured.

bool measure_mixed(const std::vector<at::Tensor>& grads, at::Tensor& found,
                   std::vector<std::pair<double, at::Tensor>>& absmax,
                   std::vector<Attributed>* attributed) {
  const auto groups = by_dtype(grads);
  if (groups.size() <= 1) return false;
  for (const auto& [dtype, index] : groups) {
    at::Tensor a = zero_on(found.device());
    auto m = kernels::Measures().grad_absmax(a);
    if (attributed) {  // this dtype's flags, at its gradients' positions in the list
      attributed->push_back({whole_list(index.size(), found.device()).flags, index});
      m.nonfinite(attributed->back().flags);
    }
    kernels::check_finite(pick(grads, index), found, m);
    absmax.emplace_back(dtype_max_of(dtype), a);
  }
  return true;
}

/// unscale_and_check of `grads` into `found`, measuring them (absmax per dtype).
void unscale_measured(const std::vector<at::Tensor>& grads, float inv_scale, at::Tensor& found,
                      std::vector<std::pair<double, at::Tensor>>& absmax,
                      std::vector<Attributed>* attributed) {
  kernels::Measures m;
  if (attributed) {  // the one call over the whole list names them
    attributed->push_back(whole_list(grads.size(), found.device()));
    m.nonfinite(attributed->back().flags);
  }
  if (measure_mixed(grads, found, absmax)) {
    kernels::unscale_and_check(grads, inv_scale, found, m);
  } else {
    at::Tensor a = zero_on(found.device());
    kernels::unscale_and_check(grads, inv_scale, found, m.grad_absmax(a));
    if (!grads.empty()) absmax.emplace_back(dtype_max_of(grads[0].scalar_type()), a);
  }
}

}  // namespace detail

namespace {

/// The found_inf a fused step takes: the sum over devices (its masters are all on the CPU).
at::Tensor found_on_cpu(const OptimizerRecord& rec) {
  if (rec.found_inf_per_device.size() == 1 && rec.found_inf_per_device[0].first.is_cpu())
    return rec.found_inf_per_device[0].second;
  return at::full({}, rec.any_found_inf() ? 1.0f : 0.0f, at::kFloat);
}

}  // namespace

void check_measured(const std::vector<at::Tensor>& grads, at::Tensor& found,
                    std::vector<std::pair<double, at::Tensor>>& absmax,
                    std::vector<Attributed>* attributed) {
  if (measure_mixed(grads, found, absmax, attributed)) return;
  at::Tensor a = zero_on(found.device());
  auto m = kernels::Measures().grad_absmax(a);
  if (attributed) {
    attributed->push_back(detail::whole_list(grads.size(), found.device()));
    m.nonfinite(attributed->back().flags);
  }
  kernels::check_finite(grads, found, m);
  if (!grads.empty()) absmax.emplace_back(dtype_max_of(grads[0].scalar_type()), a);
}

namespace {
/// `attributed`'s positions (into one device's list) as the optimizer's parameter indices.
void add_attributed(std::vector<Attributed>& attributed, const std::vector<std::size_t>& params,
                    std::vector<Attributed>& out) {
  for (Attributed& a : attributed) {
    for (std::size_t& i : a.params)
      i = params[i];
    out.push_back(std::move(a));
  }
}
}  // namespace

Unscaled StepTracker::check_grads(torch::optim::Optimizer& opt) const {
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> per_device;
  std::vector<std::vector<std::size_t>> params;  // per device: each grad's parameter index
  std::size_t index = 0;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) {
        ++index;
        continue;
      }
      auto it = std::find_if(per_device.begin(), per_device.end(),
                             [&](const auto& e) { return e.first == g.device(); });
      if (it == per_device.end()) {
        it = per_device.insert(per_device.end(), {g.device(), {}});
        params.emplace_back();
      }
      it->second.push_back(g);
      params[std::size_t(it - per_device.begin())].push_back(index++);
    }
  Unscaled out;
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    auto& [device, grads] = per_device[d];
    at::Tensor f = zero_on(device);
    std::vector<Attributed> attributed;
    check_measured(grads, f, out.absmax, &attributed);
    out.found_inf_per_device.emplace_back(device, f);
    add_attributed(attributed, params[d], out.nonfinite);
  }
  return out;
}

bool StepTracker::check_for_fused_(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                                   std::vector<at::Tensor> weights) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  std::vector<at::Tensor> defined;
  for (const at::Tensor& g : grads)
    if (g.defined()) defined.push_back(g);
  at::Tensor f = zero_on(c10::Device(c10::kCPU));
  std::vector<std::pair<double, at::Tensor>> absmax;
  check_measured(defined, f, absmax);  // refusals: invalid_gradients, nothing recorded
  return record_fused_check_(opt, std::move(grads), std::move(weights), f, std::move(absmax));
}

bool StepTracker::record_fused_check_(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                                      std::vector<at::Tensor> weights, at::Tensor f,
                                      std::vector<std::pair<double, at::Tensor>> absmax) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = {{f.device(), f}};
  rec.absmax = std::move(absmax);
  rec.stage = OptState::unscaled;
  rec.check_only = true;
  rec.at_scale = true;
  rec.grad_coef = 1;
  rec.grads = std::move(grads);
  rec.weights = std::move(weights);
  agree(rec);
  return rec.any_found_inf();
}

void StepTracker::write_weights_in_step(const torch::optim::Optimizer& opt,
                                        std::vector<at::Tensor> weights) {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage != OptState::unscaled || it->second.check_only)
    throw ScalerError(errc::protocol_misuse,
                      "write_weights_in_step: the optimizer's gradients were not moved in this "
                      "iteration, or it has stepped already");
  it->second.weights = std::move(weights);
}

bool StepTracker::wrote_weights(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  return it != records_.end() && it->second.wrote_weights;
}

Unscaled StepTracker::unscale_grads(torch::optim::Optimizer& opt, float inv_scale) const {
  // Collect and check everything before the first write, so a refusal changes nothing.
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> per_device;
  std::vector<std::vector<std::size_t>> params;  // per device: each grad's parameter index
  std::size_t index = 0;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) {
        ++index;
        continue;
      }
      if (!allow_fp16_grads_ && g.scalar_type() == at::kHalf)
        throw ScalerError(errc::fp16_grads, texts::fp16_grads);
      at::Tensor to_unscale = g;
      if (g.is_sparse()) {
        // Uncoalesced fp16 values could overflow when summed later; torch coalesces them here.
        if (g.scalar_type() == at::kHalf) g = g.coalesce();
        to_unscale = g._values();
      }
      auto it = std::find_if(per_device.begin(), per_device.end(),
                             [&](const auto& e) { return e.first == to_unscale.device(); });
      if (it == per_device.end()) {
        per_device.emplace_back(to_unscale.device(), std::vector<at::Tensor>{});
        params.emplace_back();
        it = per_device.end() - 1;
      }
      it->second.push_back(to_unscale);
      params[std::size_t(it - per_device.begin())].push_back(index++);
    }
  }
  Unscaled out;
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    auto& [device, grads] = per_device[d];
    at::Tensor f = zero_on(device);
    std::vector<Attributed> attributed;
    unscale_measured(grads, inv_scale, f, out.absmax, &attributed);  // refusals: invalid_gradients
    out.found_inf_per_device.emplace_back(device, f);
    add_attributed(attributed, params[d], out.nonfinite);
  }
  return out;
}

bool StepTracker::unscale_(torch::optim::Optimizer& opt, float inv_scale) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  Unscaled found = unscale_grads(opt, inv_scale);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = std::move(found.found_inf_per_device);
  rec.absmax = std::move(found.absmax);
  rec.nonfinite = std::move(found.nonfinite);
  rec.stage = OptState::unscaled;
  agree(rec);
  return rec.any_found_inf();
}

StepOutcome StepTracker::step(torch::optim::Optimizer& opt, float inv_scale,
                              const std::function<void(bool found_inf)>& on_unscaled) {
  auto it = records_.find(&opt);
  const OptState stage = it == records_.end() ? OptState::ready : it->second.stage;
  check_can_step(stage);
  StepOutcome out;
  out.unscaled_here = stage == OptState::ready;
  optim::FusedStep* fused = optim::fused_step_of(opt);
  // A fused optimizer's grads are still scaled after a check, unscaled after unscale_.
  const bool scaled = out.unscaled_here ? fused != nullptr : it->second.check_only;
  Unscaled found = !out.unscaled_here ? Unscaled{it->second.found_inf_per_device, it->second.absmax,
                                                 it->second.nonfinite}
                   : fused            ? check_grads(opt)
                                      : unscale_grads(opt, inv_scale);
  if (found.found_inf_per_device.empty())
    throw ScalerError(errc::no_inf_checks_for_optimizer, texts::no_inf_checks_for_optimizer);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = std::move(found.found_inf_per_device);
  rec.absmax = std::move(found.absmax);
  rec.nonfinite = std::move(found.nonfinite);
  rec.stage = OptState::unscaled;
  if (out.unscaled_here) {
    rec.at_scale = fused != nullptr;
    agree(rec);
  }
  out.found_inf = rec.any_found_inf();
  out.skipped = out.found_inf;
  if (out.unscaled_here && on_unscaled) on_unscaled(out.found_inf);
  // Like torch: if opt.step() throws, the record stays UNSCALED with its inf checks.
  if (!out.skipped && fused) {
    auto s = optim::ScaledStep().found_inf(found_on_cpu(rec)).grads(rec.grads).weights(rec.weights);
    if (scaled) s.inv_scale(clipped_inv_scale(inv_scale, rec.grad_coef));
    fused->step_scaled(s);
    rec.wrote_weights = !rec.weights.empty();
    out.ret = at::Tensor();
  } else if (!out.skipped) {
    out.ret = opt.step();
  }
  rec.stage = OptState::stepped;
  return out;
}

OptState StepTracker::stage(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  return it == records_.end() ? OptState::ready : it->second.stage;
}

std::optional<bool> StepTracker::found_inf(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage == OptState::ready) return std::nullopt;
  return it->second.any_found_inf();
}

std::optional<bool> StepTracker::local_found_inf(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage == OptState::ready) return std::nullopt;
  return it->second.local_found_inf;
}

std::vector<std::int32_t> StepTracker::found_by(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage == OptState::ready) return {};
  return it->second.found_by;
}

StepTracker::StepTracker(bool allow_fp16_grads, std::shared_ptr<RankGroup> ranks)
    : allow_fp16_grads_(allow_fp16_grads), ranks_(std::move(ranks)) {}

GradSize StepTracker::local_values(OptimizerRecord& rec, std::vector<float>& v) const {
  rec.local_found_inf = rec.any_found_inf();
  const GradSize size = rec.grad_size();
  if (ranks_) v = agreement_values(*ranks_, rec.local_found_inf, size.max);
  return size;
}

void StepTracker::apply_agreed(OptimizerRecord& rec, const std::vector<float>& v,
                               const GradSize& size) const {
  for (auto& [device, t] : rec.found_inf_per_device)
    t.fill_(v[0]);
  rec.agreed = true;
  rec.agreed_size = {double(v[1]), size.dtype_max};
  rec.found_by = ranks_that_found(v);
}

void StepTracker::agree(OptimizerRecord& rec) const {
  std::vector<float> v;
  const GradSize size = local_values(rec, v);
  if (!ranks_) return;
  // One collective per unscale on every rank, even one without gradients, so that the ranks'
  // calls stay paired.
  ranks_->all_max(v.data(), int(v.size()));
  apply_agreed(rec, v, size);
}

GradSize StepTracker::grad_size(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage == OptState::ready) return {};
  return it->second.grad_size();
}

bool StepTracker::has_inf_checks(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  return it != records_.end() && !it->second.found_inf_per_device.empty();
}

std::size_t StepTracker::recorded() const {
  std::size_t n = 0;
  for (const auto& [opt, rec] : records_)
    n += !rec.found_inf_per_device.empty();
  return n;
}

bool StepTracker::any_found_inf() const {
  for (const auto& [opt, rec] : records_)
    if (rec.any_found_inf()) return true;
  return false;
}

}  // namespace ampactor
