// The overlapped backward with data-parallel ranks: each bucket's gradients are moved into the
// masters' fp32 grads, checked and averaged across the ranks as soon as it is ready, its
// found_inf and size agreed in the same collective (sharded: reduce-scattered, each rank getting
// its pieces' mean); the speculative step reads the mean.
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "actors/internal/pipeline_job.h"
#include "internal/overlap_backward.h"
#include "internal/shard_state.h"

namespace ampactor::internal {

void OverlapBackward::move_and_average(std::size_t b, const std::vector<at::Tensor>& grads,
                                       JobContext& job) {
  std::vector<at::Tensor> masters;
  for (std::size_t i : buckets_[b])
    masters.push_back(grad_dest(i));
  at::Tensor f = at::zeros({}, at::kFloat);
  AbsmaxList absmax;
  // The scale's inverse as the scaler's grad move takes it: the reciprocal in double, as a float.
  move_measured(grads, masters, float(1.0 / double(job.scale())), f, absmax);
  OptimizerRecord local;
  local.absmax = absmax;
  const GradSize size = local.grad_size();
  std::vector<float> v = agreement_values(*ranks_, f.item<float>() != 0, size.max);
  local_found_ = local_found_ || v[0] != 0;
  std::vector<at::Tensor> moved;
  for (const at::Tensor& m : masters)
    if (m.grad().defined()) moved.push_back(m.grad());
  averaged_[b] = true;  // from here this bucket's collective is made (or the iteration fails)
  // Sharded: reduce-scattered, this rank's pieces of the bucket holding the mean.
  if (shard_)
    shard_->reduce(buckets_[b], v.data(), int(v.size()));
  else
    ranks_->average(moved, v.data(), int(v.size()));
  found_ = found_ || v[0] != 0;
  const std::vector<std::int32_t> by = ranks_that_found(v);
  found_by_.insert(found_by_.end(), by.begin(), by.end());
  // The size nearest to overflow over the buckets, as the whole gradient's would be.
  auto ratio = [](double max, double dtype_max) { return dtype_max > 0 ? max / dtype_max : 0.0; };
  if (dtype_max_ == 0 || ratio(v[1], size.dtype_max) > ratio(agreed_max_, dtype_max_))
    agreed_max_ = v[1], dtype_max_ = size.dtype_max;
  for (auto& a : absmax)
    absmax_.push_back(std::move(a));
}

double OverlapBackward::finish_ranks(torch::optim::Optimizer& opt,
                                     const std::vector<at::Tensor>& grads, JobContext& job) {
  // The buckets no job averaged (not ready, or before the optimizer was known), in bucket order:
  // every rank has averaged the same buckets before them.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (averaged_[b]) continue;
    std::vector<at::Tensor> g;
    for (std::size_t i : buckets_[b])
      g.push_back(grads[i]);
    move_and_average(b, g, job);
  }
  std::sort(found_by_.begin(), found_by_.end());  // each bucket named its ranks: once each
  found_by_.erase(std::unique(found_by_.begin(), found_by_.end()), found_by_.end());
  internal::PipelineJob(job).record_agreed_move_(opt, weights_out(), local_found_, found_,
                                                 GradSize{agreed_max_, dtype_max_}, absmax_,
                                                 found_by_);
  if (shard_) shard_->attach_grads();  // the step reads its pieces of the mean
  if (!clip_ || found_) return std::numeric_limits<double>::quiet_NaN();
  if (shard_) return shard_->clip(*clip_);  // each rank measures its pieces of the mean
  // Of the mean, in parameter order; a parameter the sharded layout would cut, by its pieces.
  std::vector<std::int64_t> numels;
  for (const at::Tensor& p : model_)
    numels.push_back(p.numel());
  const ShardLayout layout(numels, ranks_->size());
  std::vector<double> squares;
  for (std::size_t i = 0; i < model_.size(); ++i)
    if (const at::Tensor& g = grad_dest(i).grad(); g.defined())
      squares.push_back(piece_square(g, layout, i, squares_[i]));
  return job.clip_grad_norm_(opt, *clip_, &squares);
}

}  // namespace ampactor::internal
