#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include "actors/internal/pipeline_job.h"
#include "internal/host_offload.h"
#include "internal/overlap_backward.h"
#include "internal/plan.h"
#include "internal/shard_state.h"

#include <caf/atom.hpp>
#include <caf/logger.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <stdexcept>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace ampactor {

AsyncOptimizerOptions& AsyncOptimizerOptions::staleness(int v) {
  if (v != 0 && v != 1)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer: staleness must be 0 or 1, got " + std::to_string(v));
  staleness_ = v;
  return *this;
}

AsyncOptimizerOptions& AsyncOptimizerOptions::optim_dtype(at::ScalarType v) {
  if (v != at::kFloat && v != at::kDouble)
    throw ScalerError(errc::bad_option, "AsyncOptimizer: optim_dtype must be float or double");
  optim_dtype_ = v;
  return *this;
}

AsyncOptimizerOptions& AsyncOptimizerOptions::optimizer_threads(int v) {
  if (v < 0)
    throw ScalerError(errc::bad_option,
                      "AsyncOptimizer: optimizer_threads must be >= 0, got " + std::to_string(v));
  optimizer_threads_ = v;
  return *this;
}

namespace {

/// The optimizer thread's OpenMP team size. LibTorch sets each thread's size lazily from a
/// process-wide value on first use: trigger that first, then set this thread's alone
/// (at::set_num_threads would change the process-wide value too, and with it any thread that has
/// not yet used LibTorch).
void set_team_size(GradScaler& scaler, int n) {
  scaler.run_on_optimizer([n] {
    at::get_num_threads();
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
  });
}

}  // namespace

AsyncOptimizer::AsyncOptimizer(std::vector<at::Tensor> model_params, GradScaler& scaler,
                               AsyncOptimizerOptions options)
    : model_(std::move(model_params)),
      scaler_(&scaler),
      options_(options),
      deferring_(options.defer_grad_move()) {
  // Every refusal first (internal/plan.h), then what the plan needs is built.
  const internal::PipelinePlan plan = internal::plan_pipeline(options_, scaler, model_);
  at::AutoGradMode no_grad(false);
  if (plan.masters == internal::PipelinePlan::Masters::host_offload)
    offload_ = std::make_unique<internal::HostOffload>(model_);
  // Every rank's pipeline must shard alike, or their collectives would not pair up.
  if (const auto& ranks = scaler.options().ranks())
    ranks->require_same("pipeline options", std::string("shard_optimizer_state=") +
                                                (options_.shard_optimizer_state() ? "on" : "off"));
  make_masters(plan.sharded, plan.master_device);
  if (options_.swap_weights()) {  // the deferred steps' mailbox (defer_grad_move, fused steps)
    waiter_ = std::make_unique<caf::scoped_actor>(scaler_->system());
    // CAF 0.17 pins the last system's logger to the thread; an actor system waits for every
    // such pin, so the scaler's could never go on another thread (as GradScaler does too).
    caf::logger::set_current_actor_system(nullptr);
  }
  if (const int n = options_.optimizer_threads(); n > 0) set_team_size(*scaler_, n);
  if (plan.wait == internal::PipelinePlan::Wait::overlapped)
    overlap_ = std::make_unique<internal::OverlapBackward>(
        scaler, model_, internal::buckets_for(options_, model_), options_.ready_by_hooks(),
        options_.clip_grad_norm(), offload_.get(), shard_.get());
  if (overlap_)
    overlap_->set_release([this] {
      // Its optimizer goes first (declared after the pipeline, say, and unwinding): the bucket
      // jobs queued with it run now, while it is whole.
      if (scaler_) scaler_->finish_jobs();
      overlap_->forget_optimizer();
    });
  // Last: a constructor that throws leaves nothing registered. A scaler that goes first takes
  // its system, and so the scoped actor that waits in it.
  scaler_->on_gone(this, [this] {
    waiter_.reset();
    scaler_ = nullptr;
  });
}

void AsyncOptimizer::make_masters(bool sharded, at::Device master_device) {
  if (sharded) {
    // The model on a GPU: the shard's flat buffer holds the pinned host weights the offload
    // copies to it, filled from the model once here.
    std::vector<at::Tensor>* weights = &model_;
    if (offload_) {
      weights = &offload_->host_weights();
      for (std::size_t i = 0; i < model_.size(); ++i)
        (*weights)[i].copy_(model_[i].detach());
    }
    shard_ = std::make_unique<internal::ShardedState>(
        *weights, scaler_->options().ranks(), options_.optim_dtype(),
        /*spare=*/options_.swap_weights() || options_.overlap_backward(),
        /*pinned=*/offload_ != nullptr);
    masters_ = shard_->masters();
    for (const at::Tensor& m : masters_)
      master_impls_.insert(m.unsafeGetTensorImpl());
  }
  for (std::size_t i = 0; i < model_.size() && !shard_; ++i) {
    const at::Tensor& p = model_[i];
    masters_.push_back(p.detach()
                           .to(master_device, options_.optim_dtype(), /*non_blocking=*/false,
                               /*copy=*/true)
                           .set_requires_grad(true));
    master_impls_.insert(masters_.back().unsafeGetTensorImpl());
    if (options_.swap_weights()) spare_.push_back(p.detach().clone());
  }
}

AsyncOptimizer::~AsyncOptimizer() {
  if (overlap_) overlap_->unlink();  // an optimizer that outlives it no longer calls it
  // The queued jobs run to their end before the masters and the optimizers it owns go, even
  // after a job's error (which the scaler reports). A scaler that went first ran them all.
  if (!scaler_) return;
  scaler_->finish_jobs();
  scaler_->forget(this);
}

GradScaler& AsyncOptimizer::scaler() const {
  if (!scaler_)
    throw ScalerError(errc::protocol_misuse,
                      "AsyncOptimizer: its GradScaler was destroyed; a pipeline cannot step "
                      "without the scaler it was built with");
  return *scaler_;
}

void AsyncOptimizer::adopt(std::shared_ptr<torch::optim::Optimizer> opt) {
  check_optimizer(*opt);
  // overlap_backward steps the first fused optimizer made here from the first backward on.
  if (overlap_ && !overlap_->optimizer() && optim::fused_step_of(*opt) &&
      internal::OverlapBackward::holds_in_order(*opt, masters_))
    overlap_->use(*opt, masters_);
  owned_.push_back(std::move(opt));
}

void AsyncOptimizer::copy_to_model() {
  if (shard_ && offload_) {  // into the pinned host weights (a collective), then to the model
    shard_->gather(offload_->weights_to_write());
    at::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < model_.size(); ++i)
      model_[i].detach().copy_(offload_->host_weights()[i]);
    return;
  }
  if (shard_) return shard_->gather(model_);  // a collective: every rank copies in turn
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < model_.size(); ++i)
    model_[i].detach().copy_(masters_[i]);
}

void AsyncOptimizer::copy_to_spare() {
  if (shard_) return shard_->gather_spare();  // a collective, as copy_to_model's
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < spare_.size(); ++i)
    spare_[i].copy_(masters_[i]);
}

void AsyncOptimizer::swap_in() {
  // The trainer waits meanwhile, and backward is over: nothing reads the parameters' storage.
  if (shard_) return shard_->swap(model_);
  for (std::size_t i = 0; i < model_.size(); ++i) {
    at::Tensor old = model_[i].variable_data();  // the storage the model used until now
    model_[i].set_data(spare_[i]);
    spare_[i] = std::move(old);
  }
}

std::vector<at::Tensor> AsyncOptimizer::model_grads() const {
  std::vector<at::Tensor> g;
  g.reserve(model_.size());
  for (const at::Tensor& p : model_)
    g.push_back(p.grad());
  return g;
}

void AsyncOptimizer::check_optimizer(const torch::optim::Optimizer& opt) const {
  std::size_t i = 0;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      if (!master_impls_.count(p.unsafeGetTensorImpl()))
        throw ScalerError(errc::bad_parameters,
                          "AsyncOptimizer::step: the optimizer's parameter " + std::to_string(i) +
                              " is not one of optim_parameters(): build the optimizer over "
                              "the pipeline's masters (optim_parameters()), not the model's "
                              "parameters");
      ++i;
    }
}

bool AsyncOptimizer::fuses(torch::optim::Optimizer& opt) const {
  return optim::fused_step_of(opt) != nullptr && !scaler().options().ranks();
}

void AsyncOptimizer::step(torch::optim::Optimizer& opt, std::function<void()> fn) {
  check_optimizer(opt);
  warn_uncleared_grads();
  behind_ = options_.staleness() == 1;
  if (overlap_) return step_overlap(opt, std::move(fn));  // it clips with the buckets' measures
  if (shard_) return step_sharded(opt, std::move(fn));    // it clips with its shard's pieces
  fn = clipping(opt, std::move(fn));
  if (offload_) return step_offload(opt, std::move(fn));
  std::vector<at::Tensor> grads = model_grads();
  // A fused optimizer reads the model's grads in its step and writes the weights in the same
  // pass: the job checks the grads (UnscaleDone) instead of moving them. Not with ranks: their
  // mean is made in fp32 by the move, and the fused step then reads the masters' grads.
  const bool fused = fuses(opt);
  if (options_.staleness() == 0) {
    run_step([&] {
      JobContext* job = JobContext::current();
      if (fused)
        internal::PipelineJob(*job).check_for_fused_(opt, grads, masters_, model_);
      else
        internal::PipelineJob(*job).move_and_unscale_(opt, grads, masters_);
      if (fn) fn();
      if (!fused || !internal::PipelineJob(*job).wrote_weights(opt)) copy_to_model();
    });
    return;
  }
  // At staleness 1 the fused step reads the grads during the next backward: it takes them, and
  // from then on every step is a deferred one (one protocol for the spare weights). The first
  // waits for the waited steps' jobs, which may still be filling the spare.
  if (fused && !deferring_) scaler().run_on_optimizer([] {});
  deferring_ = deferring_ || fused;
  if (deferring_) return step_deferred(opt, std::move(grads), std::move(fn));
  // (a) and (b) in one job, waited for: the queue is FIFO, so this also waits for the previous
  // fn, whose result (a) publishes to the model.
  run_step([&] {
    if (options_.swap_weights())
      swap_in();
    else
      copy_to_model();
    internal::PipelineJob(*JobContext::current()).move_and_unscale_(opt, grads, masters_);
  });
  if (!options_.swap_weights()) {
    if (fn) scaler().submit(std::move(fn), SubmitOptions().unscales(UnscalePermit::none()));
    return;
  }
  // The spare is filled even when fn fails, as the copy of the next step would have been.
  scaler().submit(
      [this, fn = std::move(fn)] {
        try {
          if (fn) fn();
        } catch (...) {
          copy_to_spare();
          throw;
        }
        copy_to_spare();
      },
      SubmitOptions().unscales(UnscalePermit::none()));
}

namespace {

using spare_atom = caf::atom_constant<caf::atom("spare")>;

/// Tells the trainer's mailbox, once, whether a job filled the spare weights. A job dropped
/// unrun (cancel) says "not filled" when its closure is destroyed, so nobody waits forever.
struct SpareNotice {
  explicit SpareNotice(caf::actor who) : to(std::move(who)) {}
  SpareNotice(const SpareNotice&) = delete;
  SpareNotice& operator=(const SpareNotice&) = delete;
  ~SpareNotice() { send(false); }
  void send(bool filled) {
    if (sent) return;
    sent = true;
    caf::anon_send(to, spare_atom::value, filled);
  }
  caf::actor to;
  bool sent = false;
};

}  // namespace

void AsyncOptimizer::take_spare() {
  // With defer_grad_move the trainer swaps itself: the job that filled the spare said so in a
  // message, so the swap costs no round trip to the optimizer thread, and none at all when the
  // job ended during the forward/backward.
  bool filled = true;  // no job pending: the spare already holds the masters' weights
  if (spare_pending_) {
    (*waiter_)->receive([&](spare_atom, bool f) { filled = f; });
    spare_pending_ = false;
  }
  if (filled) {
    swap_in();
    return;
  }
  scaler().run_on_optimizer([&] {  // the job was dropped unrun: take the masters as they are
    copy_to_model();
    copy_to_spare();
  });
}

void AsyncOptimizer::step_deferred(torch::optim::Optimizer& opt, std::vector<at::Tensor> grads,
                                   std::function<void()> fn) {
  // The job owns the grads from here: the next backward writes fresh ones, never these.
  for (at::Tensor& p : model_)
    p.mutable_grad() = at::Tensor();
  // (a): the previous job's weights become the model's before the next forward.
  if (options_.swap_weights())
    take_spare();
  else
    scaler().run_on_optimizer([&] { copy_to_model(); });  // FIFO: after the previous job
  std::shared_ptr<SpareNotice> notice;
  if (options_.swap_weights()) {
    notice = std::make_shared<SpareNotice>(caf::actor{*waiter_});
    spare_pending_ = true;  // exactly one word comes, even if submit() throws
  }
  // (b) then fn, not waited for. The trainer counts the move's unscale now, so under the exact
  // policy the next scale() waits for the move's inf check only, never for fn.
  scaler().submit(
      [this, &opt, grads = std::move(grads), fn = std::move(fn), notice = std::move(notice)] {
        // The spare is filled even when the move or fn fails, as in step(). The grads are the
        // job's alone: fp32 ones become the masters' grads without a copy.
        JobContext* job = JobContext::current();
        const bool fused = fuses(opt);
        try {
          if (fused)  // the fused step writes the spare itself (nobody reads it before the word)
            internal::PipelineJob(*job).check_for_fused_(
                opt, grads, masters_, notice ? spare_ : std::vector<at::Tensor>{});
          else
            internal::PipelineJob(*job).move_and_unscale_(opt, grads, masters_, /*adopt=*/true);
          if (fn) fn();
        } catch (...) {
          if (notice) copy_to_spare(), notice->send(true);
          throw;
        }
        if (notice && !(fused && internal::PipelineJob(*job).wrote_weights(opt))) copy_to_spare();
        if (notice) notice->send(true);
      },
      SubmitOptions().unscales(UnscalePermit::exactly(1)));
}

void AsyncOptimizer::sync() {
  scaler();  // a pipeline whose scaler is gone refuses before anything changes
  behind_ = false;
  if (offload_) {
    scaler().run_on_optimizer([] {});
    offload_->exchange(nullptr, &model_);
    return;
  }
  if (waiter_ && deferring_ && !shard_) {  // a sharded pipeline's jobs send no word: below
    take_spare();                          // the newest weights are the model's
    scaler().run_on_optimizer([&] { copy_to_spare(); });  // both buffers equal
    return;
  }
  scaler().run_on_optimizer([&] {
    if (options_.swap_weights())
      swap_in(), copy_to_spare();  // both buffers equal: the next step may swap again
    else
      copy_to_model();
  });
}

}  // namespace ampactor
