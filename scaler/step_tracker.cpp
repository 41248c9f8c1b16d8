// The step tracker: torch's stage machine per optimizer and its records (found_inf per device,
// the sizes measured, the weights a fused step writes). Measuring: measure.cpp; the ranks'
// agreement: ranks.cpp.
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

using detail::unscale_measured;
using detail::zero_on;

bool OptimizerRecord::any_found_inf() const {
  for (const auto& [device, t] : found_inf_per_device)
    if (t.item<float>() != 0.0f) return true;
  return false;
}

GradSize OptimizerRecord::grad_size() const {
  if (agreed) return agreed->size;
  GradSize best;
  for (const auto& [dtype_max, t] : absmax) {
    const double m = t.item<float>();
    if (best.dtype_max == 0 || m / dtype_max > best.max / best.dtype_max) best = {m, dtype_max};
  }
  return best;
}

namespace {

/// The found_inf a fused step takes: the sum over devices (its masters are all on the CPU).
at::Tensor found_on_cpu(const OptimizerRecord& rec) {
  if (rec.found_inf_per_device.size() == 1 && rec.found_inf_per_device[0].first.is_cpu())
    return rec.found_inf_per_device[0].second;
  return at::full({}, rec.any_found_inf() ? 1.0f : 0.0f, at::kFloat);
}

}  // namespace

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
  AbsmaxList absmax;
  check_measured(defined, f, absmax);  // refusals: invalid_gradients, nothing recorded
  return record_fused_check_(opt, std::move(grads), std::move(weights), f, std::move(absmax));
}

bool StepTracker::record_fused_check_(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                                      std::vector<at::Tensor> weights, at::Tensor f,
                                      AbsmaxList absmax) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = {{f.device(), f}};
  rec.absmax = std::move(absmax);
  rec.stage = OptState::unscaled;
  rec.grads = AtScale{std::move(grads)};
  rec.weights = {std::move(weights)};
  agree(rec);
  return rec.any_found_inf();
}

void StepTracker::write_weights_in_step(const torch::optim::Optimizer& opt,
                                        std::vector<at::Tensor> weights) {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage != OptState::unscaled || it->second.at_scale())
    throw ScalerError(errc::protocol_misuse,
                      "write_weights_in_step: the optimizer's gradients were not moved in this "
                      "iteration, or it has stepped already");
  it->second.weights = {std::move(weights)};
}

bool StepTracker::wrote_weights(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  return it != records_.end() && it->second.weights.written;
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
  const bool scaled = out.unscaled_here ? fused != nullptr : it->second.at_scale();
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
    if (fused) rec.grads = AtScale{};
    agree(rec);
  }
  out.found_inf = rec.any_found_inf();
  out.skipped = out.found_inf;
  if (out.unscaled_here && on_unscaled) on_unscaled(out.found_inf);
  // Like torch: if opt.step() throws, the record stays UNSCALED with its inf checks.
  if (!out.skipped && fused) {
    const AtScale* checked = std::get_if<AtScale>(&rec.grads);
    auto s = optim::ScaledStep()
                 .found_inf(found_on_cpu(rec))
                 .grads(checked ? checked->grads : std::vector<at::Tensor>{})
                 .weights(rec.weights.weights);
    if (scaled) s.inv_scale(clipped_inv_scale(inv_scale, checked ? checked->grad_coef : 1.0));
    fused->step_scaled(s);
    rec.weights.written = !rec.weights.weights.empty();
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
  const OptimizerRecord& rec = it->second;
  return rec.agreed ? rec.agreed->local_found_inf : rec.any_found_inf();
}

std::vector<std::int32_t> StepTracker::found_by(const torch::optim::Optimizer& opt) const {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage == OptState::ready) return {};
  return it->second.agreed ? it->second.agreed->found_by : std::vector<std::int32_t>{};
}

StepTracker::StepTracker(bool allow_fp16_grads, std::shared_ptr<RankGroup> ranks)
    : allow_fp16_grads_(allow_fp16_grads), ranks_(std::move(ranks)) {}

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
