// AsyncOptimizer's overlapped-backward mode, its side in the pipeline: the options' checks, the
// buckets, and step() (internal/overlap_backward.h does the work).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <string>

#include "actors/internal/pipeline_job.h"
#include "internal/host_offload.h"
#include "internal/overlap_backward.h"

namespace ampactor {

AsyncOptimizerOptions& AsyncOptimizerOptions::bucket_bytes(std::int64_t v) {
  if (v <= 0)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer: bucket_bytes must be > 0, got " + std::to_string(v));
  bucket_bytes_ = v;
  return *this;
}

namespace internal {

/// overlap_backward's buckets: the given ones, checked (every parameter in exactly one, none
/// empty), or the parameters in reverse order packed into about `bytes` of masters each.
std::vector<std::vector<std::size_t>> buckets_for(const AsyncOptimizerOptions& o,
                                                  const std::vector<at::Tensor>& model) {
  const std::size_t n = model.size();
  if (o.buckets().empty()) {
    std::vector<std::vector<std::size_t>> out;
    std::int64_t in_last = 0;
    const std::int64_t elem = o.optim_dtype() == at::kDouble ? 8 : 4;
    for (std::size_t j = n; j-- > 0;) {
      const std::int64_t bytes = model[j].numel() * elem;
      if (out.empty() || (in_last > 0 && in_last + bytes > o.bucket_bytes()))
        out.emplace_back(), in_last = 0;
      out.back().push_back(j);
      in_last += bytes;
    }
    return out;
  }
  std::vector<int> seen(n, 0);
  for (std::size_t b = 0; b < o.buckets().size(); ++b) {
    if (o.buckets()[b].empty())
      throw ScalerError(errc::bad_option,
                        "AsyncOptimizer: bucket " + std::to_string(b) + " is empty");
    for (std::size_t i : o.buckets()[b]) {
      if (i >= n)
        throw ScalerError(errc::bad_option, "AsyncOptimizer: bucket " + std::to_string(b) +
                                                " names parameter " + std::to_string(i) + " of " +
                                                std::to_string(n));
      if (seen[i]++)
        throw ScalerError(errc::bad_option,
                          "AsyncOptimizer: parameter " + std::to_string(i) + " is in two buckets");
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!seen[i])
      throw ScalerError(errc::bad_option,
                        "AsyncOptimizer: parameter " + std::to_string(i) + " is in no bucket");
  return o.buckets();
}

/// Why overlap_backward cannot run with these options, or "" when it can.
std::string overlap_refusal(const AsyncOptimizerOptions& o, const GradScaler& scaler,
                            const std::vector<at::Tensor>& model) {
  if (o.staleness() != 0)
    return "overlap_backward needs staleness 0 (it is exact; staleness 1 steps a whole "
           "iteration late)";
  if (o.master_device() && !o.master_device()->is_cpu())
    return "overlap_backward needs the masters on the CPU";
  const bool offload = o.master_device() && !model.empty() && !model[0].device().is_cpu();
  if (!offload)
    for (const at::Tensor& p : model)
      if (p.defined() && !p.device().is_cpu())
        return "overlap_backward steps on the CPU: with the model on " + p.device().str() +
               " it needs master_device(kCPU) (the masters and the fused optimizer on the CPU)";
  if (offload && scaler.options().ranks())
    return "overlap_backward with the model on a GPU and data-parallel ranks is not built yet; "
           "with ranks keep the model on the CPU, or drop overlap_backward";
  return {};
}

}  // namespace internal

internal::OverlapBackward& AsyncOptimizer::overlap() const {
  if (!overlap_)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer: buckets, grads_ready and accumulate need overlap_backward");
  return *overlap_;
}

const std::vector<std::vector<std::size_t>>& AsyncOptimizer::buckets() const {
  return overlap().buckets();
}

void AsyncOptimizer::grads_ready(std::size_t bucket) {
  scaler();
  overlap().grads_ready(bucket);
}

void AsyncOptimizer::accumulate(bool on) {
  overlap().accumulate(on);
}

std::int64_t AsyncOptimizer::overlap_bytes() const {
  return overlap_ ? overlap_->extra_bytes() : 0;
}

void AsyncOptimizer::step_overlap(torch::optim::Optimizer& opt, std::function<void()> fn) {
  internal::OverlapBackward& o = *overlap_;
  // Whatever happens, the next backward starts a new iteration.
  struct Reset {
    internal::OverlapBackward& o;
    ~Reset() { o.reset_iteration(); }
  } reset{o};
  o.use(opt, masters_);
  if (o.poisoned()) {
    scaler().run_on_optimizer([&] { optim::fused_step_of(opt)->drop_speculation(); });
    throw ScalerError(errc::protocol_misuse,
                      "AsyncOptimizer::step (overlap_backward): a gradient was final twice in "
                      "this iteration (see the error its backward raised); nothing of it is "
                      "committed");
  }
  if (offload_) return step_overlap_offload(opt, std::move(fn));
  // Nothing was speculated with the scaler disabled: the synchronous step.
  if (!scaler().is_enabled() && shard_) return step_sharded(opt, std::move(fn));
  const std::vector<at::Tensor> grads = model_grads();
  if (!scaler().is_enabled()) {
    fn = clipping(opt, std::move(fn));
    run_step([&] {
      JobContext* job = JobContext::current();
      internal::PipelineJob(*job).check_for_fused_(opt, grads, masters_, model_);
      if (fn) fn();
      if (!internal::PipelineJob(*job).wrote_weights(opt)) copy_to_model();
    });
    return;
  }
  run_step([&] {
    const double norm = o.finish(opt, grads, fn);
    if (options_.clip_grad_norm()) grad_norm_ = norm;
  });
}

void AsyncOptimizer::step_overlap_offload(torch::optim::Optimizer& opt, std::function<void()> fn) {
  internal::OverlapBackward& o = *overlap_;
  if (!scaler().is_enabled()) {  // nothing was sent nor speculated: the synchronous offload step
    fn = clipping(opt, std::move(fn));
    return step_offload(opt, std::move(fn));
  }
  // The grads no bucket sent (no hook fired, or the scale was not known yet) follow now.
  const std::vector<at::Tensor> grads = model_grads();
  offload_->exchange(&grads, nullptr, &o.sent());
  run_step([&] {
    const double norm = o.finish(opt, offload_->receive_grads(), fn);
    if (options_.clip_grad_norm()) grad_norm_ = norm;
  });
  offload_->exchange(nullptr, &model_);  // the committed weights, on the copy-in stream
}

}  // namespace ampactor
