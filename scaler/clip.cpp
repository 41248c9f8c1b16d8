#include <ampactor/core/errors.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace ampactor {

double squared_norm(const at::Tensor& g) {
  double n =
      at::linalg_vector_norm(g, 2, c10::nullopt, /*keepdim=*/false, at::kFloat).item<float>();
  // Finite values whose squares overflow fp32 (above 1.8e19): measured again in double.
  if (std::isinf(n))
    n = at::linalg_vector_norm(g, 2, c10::nullopt, /*keepdim=*/false, at::kDouble).item<double>();
  return n * n;
}

double norm_of_squares(const std::vector<double>& squares, double mult) {
  double sum = 0;
  for (double s : squares)
    sum += s;
  return std::sqrt(sum) * mult;
}

double global_norm(const std::vector<at::Tensor>& grads, double mult,
                   const std::vector<double>* squares) {
  std::vector<double> measured;
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    if (squares && measured.size() >= squares->size())
      throw ScalerError(errc::protocol_misuse, "global_norm: " + std::to_string(squares->size()) +
                                                   " squares for more gradients");
    measured.push_back(squares ? (*squares)[measured.size()] : squared_norm(g));
  }
  if (squares && measured.size() != squares->size())
    throw ScalerError(errc::protocol_misuse, "global_norm: " + std::to_string(squares->size()) +
                                                 " squares for " + std::to_string(measured.size()) +
                                                 " gradients");
  return norm_of_squares(measured, mult);
}

double piece_square(const at::Tensor& g, const ShardLayout& layout, std::size_t param,
                    double measured) {
  const std::int64_t first = layout.start(param), n = g.numel();
  std::vector<std::pair<std::int64_t, std::int64_t>> cuts;  // (offset, length) in the parameter
  for (int r = 0; r < layout.world(); ++r) {
    const std::int64_t lo = std::max(first, layout.begin(r));
    const std::int64_t hi = std::min(first + n, layout.end(r));
    if (lo < hi) cuts.emplace_back(lo - first, hi - lo);
  }
  if (cuts.size() <= 1) return std::isnan(measured) ? squared_norm(g) : measured;
  const at::Tensor flat = g.reshape({-1});
  double sum = 0;
  for (std::size_t c = 0; c < cuts.size(); ++c) {
    const double s = squared_norm(flat.narrow(0, cuts[c].first, cuts[c].second));
    sum = c == 0 ? s : sum + s;
  }
  return sum;
}

double clip_coefficient(double total, double max_norm) {
  const double c = max_norm / (total + 1e-6);
  return c < 1 ? c : 1.0;
}

float clipped_inv_scale(float inv_scale, double coef) {
  if (coef >= 1) return inv_scale;
  return std::max(float(double(inv_scale) * coef), std::numeric_limits<float>::denorm_min());
}

double clip_grads_(const std::vector<at::Tensor>& grads, double max_norm,
                   const std::vector<double>* squares) {
  const double total = global_norm(grads, 1.0, squares);
  const double c = clip_coefficient(total, max_norm);
  if (c < 1) {
    at::NoGradGuard no_grad;
    for (const at::Tensor& g : grads)
      if (g.defined()) g.mul_(double(float(c)));  // torch multiplies by the fp32 coefficient
  }
  return total;
}

std::vector<at::Tensor> grads_of(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params())
      out.push_back(p.grad());
  return out;
}

double StepTracker::clip_grad_norm_(torch::optim::Optimizer& opt, double max_norm, float inv_scale,
                                    const std::vector<double>* squares) {
  auto it = records_.find(&opt);
  if (it == records_.end() || it->second.stage != OptState::unscaled)
    throw ScalerError(errc::protocol_misuse,
                      "clip_grad_norm_: the optimizer's gradients were not unscaled or checked "
                      "in this iteration, or it has stepped already");
  OptimizerRecord& rec = it->second;
  if (rec.any_found_inf()) return std::numeric_limits<double>::quiet_NaN();  // skipped anyway
  AtScale* checked = std::get_if<AtScale>(&rec.grads);
  if (!checked) return clip_grads_(grads_of(opt), max_norm, squares);
  // A fused step unscales the gradients itself: it takes the coefficient with the scale.
  const double total = global_norm(checked->grads.empty() ? grads_of(opt) : checked->grads,
                                   double(inv_scale), squares);
  checked->grad_coef = clip_coefficient(total, max_norm);
  return total;
}

}  // namespace ampactor
