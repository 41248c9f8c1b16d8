#include <ampactor/kernels/unscale.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <sstream>

namespace ampactor {

bool OptimizerRecord::any_found_inf() const {
  for (const auto& [device, t] : found_inf_per_device)
    if (t.item<float>() != 0.0f) return true;
  return false;
}

LocalGradScaler::LocalGradScaler(const GradScalerOptions& opts)
    : opts_(opts), enabled_(opts.enabled), state_(opts) {
  opts_.validate();
}

LocalGradScaler::LocalGradScaler(double init_scale, double growth_factor, double backoff_factor,
                                 std::int64_t growth_interval, bool enabled)
    : LocalGradScaler(
          GradScalerOptions{init_scale, growth_factor, backoff_factor, growth_interval, enabled}) {}

at::Tensor LocalGradScaler::scale(const at::Tensor& outputs) {
  if (!enabled_) return outputs;
  if (!outputs.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  state_.lazy_init();
  // torch keeps the scale as a 0-dim float tensor and multiplies by it: the same op here gives
  // the same result dtype and rounding (e.g. an fp16 output stays fp16).
  at::Tensor s = at::scalar_tensor(state_.scale(), at::TensorOptions().dtype(at::kFloat));
  if (!outputs.device().is_cpu()) s = s.to(outputs.device(), /*non_blocking=*/true);
  return at::mul(outputs, s);
}

std::vector<at::Tensor> LocalGradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!enabled_) return outputs;
  for (const at::Tensor& t : outputs)
    if (!t.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  for (const at::Tensor& t : outputs)
    out.push_back(scale(t));
  return out;
}

void LocalGradScaler::require_initialized(const char* funcname) const {
  if (!state_.initialized())
    throw ScalerError(errc::scale_not_initialized, scale_not_initialized_text(funcname));
}

std::vector<std::pair<c10::Device, at::Tensor>> LocalGradScaler::unscale_grads(
    torch::optim::Optimizer& opt) {
  // Collect and check everything before the first write, so a refusal changes nothing.
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> per_device;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (!opts_.allow_fp16_grads && g.scalar_type() == at::kHalf)
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
        it = per_device.end() - 1;
      }
      it->second.push_back(to_unscale);
    }
  }
  const float inv = state_.inv_scale();
  std::vector<std::pair<c10::Device, at::Tensor>> found;
  for (auto& [device, grads] : per_device) {
    at::Tensor f = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    try {
      kernels::unscale_and_check(grads, inv, f);
    } catch (const std::invalid_argument& e) {
      throw ScalerError(errc::invalid_gradients, e.what());
    }
    found.emplace_back(device, f);
  }
  return found;
}

void LocalGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!enabled_) return;
  OptimizerRecord& rec = records_[&optimizer];
  check_can_unscale(rec.stage);
  require_initialized("unscale_");
  rec.found_inf_per_device = unscale_grads(optimizer);
  rec.stage = OptState::unscaled;
}

std::optional<at::Tensor> LocalGradScaler::step(torch::optim::Optimizer& optimizer,
                                                LossClosure closure) {
  if (!enabled_) return optimizer.step(closure);
  if (closure) throw ScalerError(errc::closure_unsupported, texts::closure_unsupported);
  require_initialized("step");
  auto it = records_.find(&optimizer);
  const OptState stage = it == records_.end() ? OptState::ready : it->second.stage;
  check_can_step(stage);
  std::vector<std::pair<c10::Device, at::Tensor>> found =
      stage == OptState::ready ? unscale_grads(optimizer) : it->second.found_inf_per_device;
  if (found.empty())
    throw ScalerError(errc::no_inf_checks_for_optimizer, texts::no_inf_checks_for_optimizer);
  OptimizerRecord& rec = records_[&optimizer];
  rec.found_inf_per_device = std::move(found);
  rec.stage = OptState::unscaled;
  std::optional<at::Tensor> ret;
  if (!rec.any_found_inf()) ret = optimizer.step();
  rec.stage = OptState::stepped;
  return ret;
}

void LocalGradScaler::update() {
  if (!enabled_) return;
  require_initialized("update");
  bool any_record = false, found = false;
  for (const auto& [opt, rec] : records_) {
    any_record |= !rec.found_inf_per_device.empty();
    found = found || rec.any_found_inf();
  }
  if (!any_record)
    throw ScalerError(errc::no_inf_checks_before_update, texts::no_inf_checks_before_update);
  state_.update(found);
  records_.clear();
}

void LocalGradScaler::update(double new_scale) {
  if (!enabled_) return;
  require_initialized("update");
  if (!std::isfinite(new_scale) || !(new_scale > 0.0)) {
    std::ostringstream s;
    s << "new_scale must be finite and > 0.0, got " << new_scale;
    throw ScalerError(errc::bad_new_scale, s.str());
  }
  state_.set_scale(new_scale);
  records_.clear();
}

void LocalGradScaler::update(const at::Tensor& new_scale) {
  if (!enabled_) return;
  require_initialized("update");
  if (!new_scale.defined() || new_scale.numel() != 1 || new_scale.requires_grad() ||
      !at::isFloatingType(new_scale.scalar_type()))
    throw ScalerError(errc::bad_new_scale, texts::bad_new_scale);
  update(new_scale.item<double>());
}

double LocalGradScaler::get_scale() const {
  return enabled_ ? state_.get_scale() : 1.0;
}

StateDict LocalGradScaler::state_dict() const {
  return enabled_ ? make_state_dict(state_) : StateDict{};
}

void LocalGradScaler::load_state_dict(const StateDict& sd) {
  if (!enabled_) return;
  ampactor::load_state_dict(state_, sd);
}

OptState LocalGradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  auto it = records_.find(&optimizer);
  return it == records_.end() ? OptState::ready : it->second.stage;
}

std::optional<bool> LocalGradScaler::found_inf(const torch::optim::Optimizer& optimizer) const {
  auto it = records_.find(&optimizer);
  if (it == records_.end() || it->second.stage == OptState::ready) return std::nullopt;
  return it->second.any_found_inf();
}

}  // namespace ampactor
