#include "internal/overlap_backward.h"
#include "actors/internal/pipeline_job.h"
#include "actors/internal/pipeline_link.h"

#include "internal/host_offload.h"
#include "internal/shard_state.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace ampactor::internal {
namespace {

/// A parameter's post-accumulation hook: its gradient is final for this backward (how DDP's
/// Reducer learns it).
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(std::shared_ptr<OverlapHub> hub, std::size_t index)
      : hub(std::move(hub)), index(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (OverlapBackward* o = hub->overlap.load()) o->grad_final(index);
    return outputs;
  }
  std::shared_ptr<OverlapHub> hub;
  std::size_t index;
};

}  // namespace

// LibTorch 1.13 hands out an accumulator as a std::shared_ptr, later ones as an intrusive_ptr.
struct OverlapBackward::Accumulators {
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()))>
      nodes;
};

OverlapBackward::OverlapBackward(GradScaler& scaler, const std::vector<at::Tensor>& model,
                                 std::vector<std::vector<std::size_t>> buckets, bool hooks,
                                 std::optional<double> clip, HostOffload* offload,
                                 ShardedState* shard)
    : scaler_(scaler),
      model_(model),
      offload_(offload),
      shard_(shard),
      buckets_(std::move(buckets)),
      bucket_of_(model.size()),
      ranks_(scaler.options().ranks()),
      hub_(std::make_shared<OverlapHub>()),
      accumulators_(std::make_unique<Accumulators>()),
      main_(std::this_thread::get_id()),
      clip_(clip) {
  at::AutoGradMode no_grad(false);
  if (offload_)
    offload_->keep_device_spare();
  else if (!shard_)  // a sharded state has its own spare, flat
    for (const at::Tensor& p : model_)
      spare_.push_back(p.detach().clone());
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t i : buckets_[b])
      bucket_of_[i] = b;
  if (hooks)
    for (std::size_t i = 0; i < model_.size(); ++i) {
      if (!model_[i].requires_grad() || !model_[i].is_leaf())
        throw ScalerError(errc::bad_parameters,
                          "AsyncOptimizer (overlap_backward): model parameter " +
                              std::to_string(i) +
                              " is not a leaf that requires grad, so backward never says when "
                              "its gradient is final; pass ready_by_hooks(false) and call "
                              "grads_ready() instead");
      accumulators_->nodes.push_back(torch::autograd::impl::grad_accumulator(model_[i]));
    }
  // Installed only once every check has passed: a constructor that throws leaves no hook.
  for (std::size_t i = 0; i < accumulators_->nodes.size(); ++i)
    accumulators_->nodes[i]->add_post_hook(std::make_unique<ReadyHook>(hub_, i));
  hub_->overlap = this;
  reset_iteration();
}

OverlapBackward::~OverlapBackward() {
  hub_->overlap = nullptr;  // the hooks stay on the accumulators, doing nothing
}

bool OverlapBackward::holds_in_order(const torch::optim::Optimizer& opt,
                                     const std::vector<at::Tensor>& masters) {
  std::size_t i = 0;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params())
      if (i >= masters.size() || !p.is_same(masters[i++])) return false;
  return i == masters.size();
}

void OverlapBackward::use(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& masters) {
  if (opt_ == &opt) return;
  if (opt_)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer (overlap_backward): the buckets are stepped with one "
                      "optimizer, the first one made or stepped; step() got another");
  optim::FusedStep* fused = optim::fused_step_of(opt);
  if (!fused)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer (overlap_backward): a bucket's step is written into a "
                      "second buffer, which LibTorch's own optimizers cannot do; use "
                      "ampactor::optim::FusedAdam, FusedAdamW or FusedSGD");
  // Its steps pair the i-th parameter with the model's i-th gradient and weight.
  if (!holds_in_order(opt, masters))
    throw ScalerError(errc::bad_parameters,
                      "AsyncOptimizer (overlap_backward): the optimizer must hold every master, "
                      "in the order of optim_parameters() (make_optimizer builds one so)");
  opt_ = &opt;
  fused_ = fused;
  masters_ = masters;
  if (release_) fused_->on_release(release_);
}

void OverlapBackward::forget_optimizer() {
  opt_ = nullptr;
  fused_ = nullptr;
  masters_.clear();
}

void OverlapBackward::unlink() {
  if (fused_) fused_->on_release(nullptr);
}

void OverlapBackward::grad_final(std::size_t i) {
  // On the CPU, a backward on another thread races with the trainer: the last job checks and
  // steps it. A GPU's backward runs on its autograd thread while the trainer waits for it.
  if ((!offload_ && std::this_thread::get_id() != main_) || accumulating_) return;
  if (final_[i]) {
    poisoned_ = true;
    throw ScalerError(errc::protocol_misuse,
                      "AsyncOptimizer (overlap_backward): the gradient of parameter " +
                          std::to_string(i) +
                          " was accumulated again after it was final in this iteration (a "
                          "second backward without accumulate(true)); this iteration's step "
                          "will be refused and nothing of it committed");
  }
  final_[i] = true;
  const std::size_t b = bucket_of_[i];
  if (--left_[b] == 0 && !ready_[b]) became_ready(b);
}

void OverlapBackward::grads_ready(std::size_t b) {
  if (b >= buckets_.size())
    throw ScalerError(errc::bad_option, "AsyncOptimizer::grads_ready: bucket " + std::to_string(b) +
                                            " of " + std::to_string(buckets_.size()));
  if (ready_[b]) {
    poisoned_ = true;
    throw ScalerError(errc::protocol_misuse,
                      "AsyncOptimizer::grads_ready: bucket " + std::to_string(b) +
                          " was ready already in this iteration; this iteration's step will "
                          "be refused and nothing of it committed");
  }
  for (std::size_t i : buckets_[b])
    final_[i] = true;
  left_[b] = 0;
  became_ready(b);
}

void OverlapBackward::became_ready(std::size_t b) {
  ready_[b] = true;
  if (!ranks_) return submit(b);
  // Every rank averages the buckets in one order: bucket b waits for those before it.
  while (next_ < buckets_.size() && ready_[next_])
    submit(next_++);
}

void OverlapBackward::submit(std::size_t b) {
  // The optimizer is not known before the first step(), nor is there anything to speculate
  // with the scaler disabled: the last job then checks and steps everything.
  if (!opt_ || !scaler_.is_enabled()) return;
  std::vector<at::Tensor> grads;
  for (std::size_t i : buckets_[b])
    grads.push_back(model_[i].grad());
  if (!offload_)
    return scaler_.submit([this, b, grads = std::move(grads)] { run_bucket(b, grads); },
                          SubmitOptions().unscales(UnscalePermit::none()));
  // The grads leave the GPU now, on the copy-out stream; the job waits for them alone.
  std::vector<at::Tensor> host;
  std::shared_ptr<c10::Event> landed = offload_->send_grads(buckets_[b], grads, host);
  for (std::size_t i : buckets_[b])
    sent_[i] = true;
  std::function<void()> job = [this, b, host = std::move(host), landed] {
    HostOffload::wait(*landed);
    run_bucket(b, host);
  };
  if (std::this_thread::get_id() == main_)
    scaler_.submit(std::move(job), SubmitOptions().unscales(UnscalePermit::none()));
  else
    PipelineLink::submit_from_backward(scaler_,
                                       std::move(job));  // the scale unknown: the last job does it
}

void OverlapBackward::begin_iteration_on_optimizer(std::int64_t k) {
  if (k == k_) return;
  k_ = k;
  found_ = false;
  checked_.assign(model_.size(), false);
  absmax_.clear();
  averaged_.assign(buckets_.size(), false);
  local_found_ = false;
  found_by_.clear();
  agreed_max_ = dtype_max_ = 0;
  squares_.assign(model_.size(), std::numeric_limits<double>::quiet_NaN());
  if (shard_) shard_->prepare_grads();  // the moves write into the flat buffer it reduce-scatters
  // The last exchange has read the pinned weights: the buckets' steps may write them from here.
  if (offload_) offload_->weights_to_write();
}

void OverlapBackward::run_bucket(std::size_t b, const std::vector<at::Tensor>& grads) {
  JobContext* job = JobContext::current();
  begin_iteration_on_optimizer(job->iteration());
  try {
    if (ranks_) {
      move_and_average(b, grads, *job);
      if (found_) return;
      if (shard_) return speculate_shard(b);  // its clip measures the pieces it holds
      std::vector<at::Tensor> g;              // the ranks' mean, true-sized
      for (std::size_t i : buckets_[b])
        g.push_back(grad_dest(i).grad());
      if (clip_)
        for (std::size_t j = 0; j < g.size(); ++j)
          if (g[j].defined()) squares_[buckets_[b][j]] = squared_norm(g[j]);
      return speculate(b, g, 1.0f);
    }
    std::vector<at::Tensor> defined;
    for (const at::Tensor& g : grads)
      if (g.defined()) defined.push_back(g);
    at::Tensor f = at::zeros({}, at::kFloat);
    check_measured(defined, f, absmax_);
    for (std::size_t i : buckets_[b])
      checked_[i] = true;
    found_ = found_ || f.item<float>() != 0;
    if (found_) return;  // the step will be skipped: nothing to speculate
    if (clip_)
      for (std::size_t j = 0; j < grads.size(); ++j)
        if (grads[j].defined()) squares_[buckets_[b][j]] = squared_norm(grads[j]);
    // The scale's inverse as the scaler's step takes it: the reciprocal in double, as a float.
    speculate(b, grads, float(1.0 / double(job->scale())));
  } catch (...) {
    found_ = true;  // this iteration fails (the scaler abandons its update): speculate no more
    fused_->drop_speculation();
    throw;
  }
}

void OverlapBackward::speculate(std::size_t b, const std::vector<at::Tensor>& grads, float inv) {
  std::vector<at::Tensor> g(model_.size()), w(model_.size());
  std::vector<at::Tensor>& out = offload_ ? offload_->weights_unsynced() : spare_;
  for (std::size_t j = 0; j < grads.size(); ++j)
    g[buckets_[b][j]] = grads[j], w[buckets_[b][j]] = out[buckets_[b][j]];
  fused_->speculate(optim::ScaledStep().inv_scale(inv).grads(g).weights(w));
  // The bucket's new weights go to the device now; step() keeps them if the step is taken.
  if (offload_) offload_->stage_early(buckets_[b]);
}

void OverlapBackward::speculate_shard(std::size_t b) {
  const std::size_t n = shard_->pieces().size();
  std::vector<at::Tensor> g(n), w(n);
  bool any = false;
  for (std::size_t j = 0; j < n; ++j)
    if (bucket_of_[shard_->pieces()[j].param] == b) {
      // The views the step will read as the masters' grads (attach_grads): the same data.
      g[j] = shard_->grad_piece(j), w[j] = shard_->spare_piece(j);
      any = any || g[j].defined();
    }
  if (any) fused_->speculate(optim::ScaledStep().grads(g).weights(w));
}

double OverlapBackward::finish(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads,
                               const std::function<void()>& fn) {
  JobContext* job = JobContext::current();
  begin_iteration_on_optimizer(job->iteration());
  double norm = std::numeric_limits<double>::quiet_NaN();
  try {
    if (ranks_) {
      norm = finish_ranks(opt, grads, *job);
      if (fn) fn();
      return commit(opt, *job, norm);
    }
    std::vector<at::Tensor> rest;  // what no bucket job checked
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (!checked_[i] && grads[i].defined()) rest.push_back(grads[i]);
    at::Tensor f = at::zeros({}, at::kFloat);
    check_measured(rest, f, absmax_);
    const bool found = found_ || f.item<float>() != 0;
    internal::PipelineJob(*job).record_fused_check_(
        opt, grads, weights_out(), at::full({}, found ? 1.0f : 0.0f, at::kFloat), absmax_);
    if (clip_ && !found) {  // in parameter order, whatever order the buckets came in
      std::vector<double> squares;
      for (std::size_t i = 0; i < grads.size(); ++i)
        if (grads[i].defined())
          squares.push_back(std::isnan(squares_[i]) ? squared_norm(grads[i]) : squares_[i]);
      norm = job->clip_grad_norm_(opt, *clip_, &squares);
    }
    note_masters();
    if (fn) fn();
  } catch (...) {
    // fn threw after its step: the masters and the state have the step, so the model gets its
    // weights too, as at staleness 0 (the sharded spare's exchange is a collective the other
    // ranks may not make: there the rank's failure stops them all).
    if (!shard_ && internal::PipelineJob(*job).wrote_weights(opt)) try {
        commit(opt, *job, norm);
      } catch (...) {
      }
    fused_->drop_speculation();
    k_ = -1;
    throw;
  }
  return commit(opt, *job, norm);
}

double OverlapBackward::commit(torch::optim::Optimizer& opt, JobContext& job, double norm) {
  fused_->drop_speculation();  // skipped, or a parameter's inputs changed: not taken
  k_ = -1;
  if (shard_) {
    // Every rank agreed on the skip, so every rank exchanges or none does.
    if (internal::PipelineJob(job).wrote_weights(opt))
      shard_->exchange_spare(), shard_->swap(model_);
  } else if (!offload_) {
    if (internal::PipelineJob(job).wrote_weights(opt)) swap_weights();
  } else if (internal::PipelineJob(job).wrote_weights(opt)) {
    // A master whose speculative step was taken changed storage (a swap): its weights are those
    // staged on the device. step() hands every weight to the model on the copy-in stream.
    std::vector<bool> early(model_.size(), false);
    for (std::size_t i = 0; i < model_.size() && i < master_ptrs_.size(); ++i)
      early[i] = masters_[i].data_ptr() != master_ptrs_[i];
    offload_->weights_written(std::move(early));
  } else {
    offload_->stage_weights(masters_);  // the speculation may have written some: the masters'
  }
  return norm;
}

void OverlapBackward::note_masters() {
  master_ptrs_.clear();
  for (const at::Tensor& m : masters_)
    master_ptrs_.push_back(m.data_ptr());
}

std::vector<at::Tensor> OverlapBackward::weights_out() {
  if (offload_) return offload_->weights_to_write();
  return shard_ ? shard_->step_weights(/*spare=*/true) : spare_;
}

const at::Tensor& OverlapBackward::grad_dest(std::size_t i) const {
  return shard_ ? shard_->holders()[i] : masters_[i];
}

void OverlapBackward::swap_weights() {
  // The trainer waits for this job, and backward is over: nothing reads the parameters now.
  for (std::size_t i = 0; i < model_.size(); ++i) {
    at::Tensor old = model_[i].variable_data();
    model_[i].set_data(spare_[i]);
    spare_[i] = std::move(old);
  }
}

void OverlapBackward::reset_iteration() {
  final_.assign(model_.size(), false);
  left_.clear();
  for (const auto& b : buckets_)
    left_.push_back(b.size());
  ready_.assign(buckets_.size(), false);
  next_ = 0;
  poisoned_ = false;
  sent_.assign(model_.size(), false);
}

std::int64_t OverlapBackward::extra_bytes() const {
  std::int64_t n = fused_ ? fused_->speculation_bytes() : 0;
  if (offload_) n += offload_->device_spare_bytes();
  if (shard_) n += shard_->spare_bytes();
  for (const at::Tensor& t : spare_)
    n += std::int64_t(t.nbytes());
  return n;
}

}  // namespace ampactor::internal
