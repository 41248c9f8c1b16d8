// AsyncOptimizer's overlapped-backward mode, its side in the pipeline: the options' checks, the
// buckets and the public calls (schedule_overlap.cpp steps; internal/overlap_backward.h does the
// work).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <string>

#include "internal/overlap_backward.h"
#include "internal/pipeline.h"

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

namespace {

internal::OverlapBackward& overlap_of(const internal::Pipeline& p) {
  if (!p.overlap)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer: buckets, grads_ready and accumulate need overlap_backward");
  return *p.overlap;
}

}  // namespace

const std::vector<std::vector<std::size_t>>& AsyncOptimizer::buckets() const {
  return overlap_of(*p_).buckets();
}

void AsyncOptimizer::grads_ready(std::size_t bucket) {
  p_->scaler();
  overlap_of(*p_).grads_ready(bucket);
}

void AsyncOptimizer::accumulate(bool on) {
  overlap_of(*p_).accumulate(on);
}

std::int64_t AsyncOptimizer::overlap_bytes() const {
  return p_->overlap ? p_->overlap->extra_bytes() : 0;
}

}  // namespace ampactor
