// The pipeline's plan (internal/plan.h): every refusal of a combination in one place, in the
// order a user meets them (the staleness, the overlap, the parameters, the masters' device, the
// ranks); then the placement and the schedule it picks, each a line.
#include "internal/plan.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include "internal/overlap_backward.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/schedule.h"

namespace ampactor::internal {

namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_option, "AsyncOptimizer: " + why);
}

}  // namespace

std::string PipelinePlan::text() const {
  std::string s = masters == Masters::host_offload ? "host_offload" : "model_device";
  if (sharded) s += ", sharded";
  s += wait == Wait::synchronous ? ", synchronous"
       : wait == Wait::stale     ? ", stale"
                                 : ", overlapped";
  if (swap || defer)
    s += std::string(" (") + (swap ? "swap" : "") + (swap && defer ? ", " : "") +
         (defer ? "defer" : "") + ")";
  return s;
}

PipelinePlan plan_pipeline(const AsyncOptimizerOptions& o, const GradScaler& scaler,
                           const std::vector<at::Tensor>& model) {
  if (o.swap_weights() && o.staleness() != 1) refuse("swap_weights needs staleness 1");
  if (o.defer_grad_move() && o.staleness() != 1) refuse("defer_grad_move needs staleness 1");
  if (o.overlap_backward())
    if (const std::string why = overlap_refusal(o, scaler, model); !why.empty()) refuse(why);
  for (std::size_t i = 0; i < model.size(); ++i)
    if (!model[i].defined() || !at::isFloatingType(model[i].scalar_type()))
      throw ScalerError(errc::bad_parameters, "AsyncOptimizer: model parameter " +
                                                  std::to_string(i) +
                                                  " is not a floating-point tensor");
  PipelinePlan plan;
  const at::Device model_device = model.empty() ? at::Device(at::kCPU) : model[0].device();
  if (const auto& md = o.master_device(); md && !model.empty() && *md != model_device) {
    if (!md->is_cpu())
      refuse("master_device " + md->str() + " is neither the model's device (" +
             model_device.str() + ") nor the CPU");
    if (o.swap_weights() || o.defer_grad_move())
      refuse(
          "with the masters on the CPU the grads always move in fn's job and the weights through "
          "pinned buffers; swap_weights and defer_grad_move do not apply");
    plan.masters = PipelinePlan::Masters::host_offload;
  }
  plan.master_device = o.master_device().value_or(model_device);
  if (o.shard_optimizer_state() && !scaler.options().ranks())
    refuse("shard_optimizer_state needs data-parallel ranks (GradScalerOptions::ranks)");
  plan.sharded = o.shard_optimizer_state();
  plan.wait = o.overlap_backward() ? PipelinePlan::Wait::overlapped
              : o.staleness() == 1 ? PipelinePlan::Wait::stale
                                   : PipelinePlan::Wait::synchronous;
  plan.swap = o.swap_weights();
  plan.defer = o.defer_grad_move();
  return plan;
}

std::unique_ptr<Placement> make_placement(Pipeline& p) {
  if (p.plan.sharded) return shard_placement(p);
  if (p.plan.masters == PipelinePlan::Masters::host_offload) return host_placement(p);
  return device_placement(p);
}

std::unique_ptr<Schedule> make_schedule(Pipeline& p) {
  const PipelinePlan& plan = p.plan;
  if (plan.wait == PipelinePlan::Wait::overlapped) return overlapped_schedule(p);
  if (plan.masters == PipelinePlan::Masters::host_offload) return offload_schedule(p);
  if (plan.wait == PipelinePlan::Wait::stale && plan.defer) return deferred_schedule(p);
  if (plan.wait == PipelinePlan::Wait::stale) return stale_schedule(p);
  return synchronous_schedule(p);
}

}  // namespace ampactor::internal
