#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/scaler/ranks.h>

#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <sstream>

namespace ampactor {

LocalGradScaler::LocalGradScaler(const GradScalerOptions& opts)
    : opts_(opts),
      enabled_(opts.enabled()),
      state_(opts),
      tracker_(opts.allow_fp16_grads(), opts.ranks()) {
  opts_.validate();
  // Data parallel: every rank's trajectory must be the same, so every rank's options must be.
  if (opts_.ranks())
    opts_.ranks()->require_same("scaler options", "scaler=LocalGradScaler " + describe(opts_));
}

LocalGradScaler::LocalGradScaler(double init_scale, double growth_factor, double backoff_factor,
                                 std::int64_t growth_interval, bool enabled)
    : LocalGradScaler(GradScalerOptions::positional(init_scale, growth_factor, backoff_factor,
                                                    growth_interval, enabled)) {}

at::Tensor LocalGradScaler::scale(const at::Tensor& outputs) {
  if (!enabled_) return outputs;
  if (!outputs.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  state_.lazy_init();
  return scale_by(outputs, state_.scale());
}

std::vector<at::Tensor> scale_each(const std::vector<at::Tensor>& outputs,
                                   const std::function<at::Tensor(const at::Tensor&)>& one) {
  for (const at::Tensor& t : outputs)
    if (!t.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  std::vector<at::Tensor> out;
  out.reserve(outputs.size());
  for (const at::Tensor& t : outputs)
    out.push_back(one(t));
  return out;
}

std::vector<at::Tensor> LocalGradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!enabled_) return outputs;
  return scale_each(outputs, [this](const at::Tensor& t) { return scale(t); });
}

void LocalGradScaler::require_initialized(const char* funcname) const {
  if (!state_.initialized())
    throw ScalerError(errc::scale_not_initialized, scale_not_initialized_text(funcname));
}

void LocalGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!enabled_) return;
  check_can_unscale(tracker_.stage(optimizer));
  require_initialized("unscale_");
  tracker_.unscale_(optimizer, state_.inv_scale());
}

std::optional<at::Tensor> LocalGradScaler::step(torch::optim::Optimizer& optimizer,
                                                LossClosure closure) {
  if (!enabled_) return optimizer.step(closure);
  if (closure) throw ScalerError(errc::closure_unsupported, texts::closure_unsupported);
  require_initialized("step");
  return tracker_.step(optimizer, state_.inv_scale()).ret;
}

void LocalGradScaler::update() {
  if (!enabled_) return;
  require_initialized("update");
  if (tracker_.recorded() == 0)
    throw ScalerError(errc::no_inf_checks_before_update, texts::no_inf_checks_before_update);
  const bool found = tracker_.any_found_inf();
  // Made before the update: a collapse guard that raises leaves it, and the state, for a look.
  if (found) last_overflow_ = overflow_report(tracker_, get_scale(), names_, updates_);
  state_.update(found);
  ++updates_;
  tracker_.reset();
}

LocalGradScaler& LocalGradScaler::name_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  names_.add(named);
  return *this;
}

void check_new_scale(double new_scale) {
  check_fits_float(new_scale, errc::bad_new_scale);  // torch's fill_ refuses it with this text
  if (!std::isfinite(new_scale) || !(new_scale > 0.0)) {
    throw ScalerError(errc::bad_new_scale,
                      "new_scale must be finite and > 0.0, got " + show_value(new_scale));
  }
  check_reciprocal_finite(static_cast<float>(new_scale), errc::bad_new_scale, "new_scale");
}

double new_scale_value(const at::Tensor& new_scale) {
  if (!new_scale.defined() || new_scale.numel() != 1 || new_scale.requires_grad() ||
      !at::isFloatingType(new_scale.scalar_type()))
    throw ScalerError(errc::bad_new_scale, texts::bad_new_scale);
  return new_scale.item<double>();
}

at::Tensor scale_by(const at::Tensor& outputs, float scale) {
  // torch keeps the scale as a 0-dim float tensor and multiplies by it: the same op here gives
  // the same result dtype and rounding (e.g. an fp16 output stays fp16).
  at::Tensor s = at::scalar_tensor(scale, at::TensorOptions().dtype(at::kFloat));
  if (!outputs.device().is_cpu()) s = s.to(outputs.device(), /*non_blocking=*/true);
  return at::mul(outputs, s);
}

void LocalGradScaler::update(double new_scale) {
  if (!enabled_) return;
  require_initialized("update");
  check_new_scale(new_scale);
  state_.set_scale(new_scale);
  tracker_.reset();
}

void LocalGradScaler::update(const at::Tensor& new_scale) {
  if (!enabled_) return;
  require_initialized("update");
  update(new_scale_value(new_scale));
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
  return tracker_.stage(optimizer);
}

std::optional<bool> LocalGradScaler::found_inf(const torch::optim::Optimizer& optimizer) const {
  return tracker_.found_inf(optimizer);
}

}  // namespace ampactor
