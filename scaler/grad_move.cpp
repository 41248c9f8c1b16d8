// The pipeline's grad move (model gradients into the masters' fp32 gradients, unscaled and
// checked in one pass), and its record, also when the overlapped backward moved and averaged the
// gradients bucket by bucket.
#include <ampactor/core/errors.h>
#include <ampactor/kernels/unscale.h>
#include <ampactor/scaler/ranks.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "measure.h"

namespace ampactor {

using detail::measure_mixed;
using detail::unscale_measured;
using detail::zero_on;

namespace {
/// A gradient the caller handed over that nobody else can see (no other tensor or view shares
/// it), already fp32 and dense on the master's device: unscaling it in place and installing it
/// as the master's gradient is the move without the copy.
bool adoptable(const at::Tensor& g, const at::Tensor& master) {
  return g.scalar_type() == at::kFloat && g.device() == master.device() && g.is_contiguous() &&
         !g.requires_grad() && g.use_count() == 1 && g.storage().use_count() == 1;
}

/// move_and_unscale_'s plan: each master's gradient after the call (undefined: none), and the
/// kernels' lists.
struct GradMove {
  std::vector<at::Tensor> dest, from, to, adopted;
};

/// Checks the gradients' shapes and plans the move, installing nothing.
void plan_move(GradMove& m, const std::vector<at::Tensor>& model_grads,
               const std::vector<at::Tensor>& masters, bool adopt) {
  m.dest.resize(masters.size());
  for (std::size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& g = model_grads[i];
    if (!g.defined()) continue;
    if (g.sizes() != masters[i].sizes())
      throw ScalerError(errc::invalid_gradients, "move_and_unscale_: model gradient " +
                                                     std::to_string(i) +
                                                     " does not have its master's shape");
    if (adopt && adoptable(g, masters[i])) {
      m.adopted.push_back(g);
      m.dest[i] = g;
      continue;
    }
    at::Tensor mg = masters[i].grad();
    if (!mg.defined() || mg.sizes() != masters[i].sizes() || mg.scalar_type() != at::kFloat)
      mg = at::empty(masters[i].sizes(), masters[i].options().dtype(at::kFloat));
    m.from.push_back(g);
    m.to.push_back(mg);
    m.dest[i] = mg;
  }
}

/// Runs the planned move and the adopted gradients' unscale into `f`, measuring both.
void run_move(const GradMove& m, float inv_scale, c10::Device device, at::Tensor& f,
              AbsmaxList& absmax) {
  // The move first: if it refuses its input, no adopted gradient has been touched.
  if (measure_mixed(m.from, f, absmax)) {
    kernels::move_grads_and_unscale(m.from, m.to, inv_scale, f);
  } else {
    at::Tensor a = zero_on(device);
    kernels::move_grads_and_unscale(m.from, m.to, inv_scale, f, a);
    if (!m.from.empty()) absmax.emplace_back(dtype_max_of(m.from[0].scalar_type()), a);
  }
  if (!m.adopted.empty()) unscale_measured(m.adopted, inv_scale, f, absmax);
}
}  // namespace

void move_measured(const std::vector<at::Tensor>& model_grads,
                   const std::vector<at::Tensor>& masters, float inv_scale, at::Tensor& found,
                   AbsmaxList& absmax, bool adopt) {
  if (model_grads.size() != masters.size())
    throw ScalerError(errc::invalid_gradients,
                      "move_and_unscale_: " + std::to_string(model_grads.size()) +
                          " model gradients for " + std::to_string(masters.size()) + " masters");
  // Nothing is installed before every check has passed.
  GradMove m;
  plan_move(m, model_grads, masters, adopt);
  run_move(m, inv_scale, found.device(), found, absmax);
  for (std::size_t i = 0; i < masters.size(); ++i) {
    at::Tensor master = masters[i];
    master.mutable_grad() = m.dest[i];  // undefined where there was no gradient: skipped
  }
}

bool StepTracker::move_and_unscale_(torch::optim::Optimizer& opt,
                                    const std::vector<at::Tensor>& model_grads,
                                    std::vector<at::Tensor>& masters, float inv_scale, bool adopt,
                                    const GradReduce& reduce) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  if (model_grads.size() != masters.size())
    throw ScalerError(errc::invalid_gradients,
                      "move_and_unscale_: " + std::to_string(model_grads.size()) +
                          " model gradients for " + std::to_string(masters.size()) + " masters");
  const c10::Device device = masters.empty() ? c10::Device(c10::kCPU) : masters[0].device();
  at::Tensor f = zero_on(device);
  AbsmaxList absmax;
  move_measured(model_grads, masters, inv_scale, f, absmax, adopt);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = {{f.device(), f}};
  rec.absmax = std::move(absmax);
  rec.stage = OptState::unscaled;
  if (!ranks_) {
    agree(rec);
    return rec.any_found_inf();
  }
  // Data parallel: the ranks' mean gradient, in fp32 (the masters' grads): an fp16 sum of the
  // ranks' scaled gradients could overflow where none of them did. found_inf and the size are
  // agreed in the same round, from this rank's own check before the average (after it, one
  // rank's inf or NaN is every rank's).
  std::vector<at::Tensor> moved;
  for (const at::Tensor& p : masters)
    if (p.grad().defined()) moved.push_back(p.grad());
  std::vector<float> v;
  Agreement local = local_values(rec, v);
  if (reduce)
    reduce(moved, v.data(), int(v.size()));
  else
    ranks_->average(moved, v.data(), int(v.size()));
  apply_agreed(rec, v, std::move(local));
  return rec.any_found_inf();
}

bool StepTracker::record_agreed_move_(torch::optim::Optimizer& opt, std::vector<at::Tensor> weights,
                                      bool local_found, bool found, GradSize size,
                                      AbsmaxList absmax, std::vector<std::int32_t> found_by) {
  auto it = records_.find(&opt);
  check_can_unscale(it == records_.end() ? OptState::ready : it->second.stage);
  OptimizerRecord& rec = records_[&opt];
  rec.found_inf_per_device = {{c10::Device(c10::kCPU), at::full({}, found ? 1.0f : 0.0f)}};
  rec.absmax = std::move(absmax);
  rec.stage = OptState::unscaled;
  rec.grads = InPlace{};  // the masters' grads hold the true-sized mean
  rec.weights = {std::move(weights)};
  rec.agreed = Agreement{local_found, size, std::move(found_by)};
  return found;
}

}  // namespace ampactor
