// AsyncOptimizer: its options' checks, and its calls forwarded to the pipeline behind it
// (internal/pipeline.h), which the plan builds once: the placement of the masters and the
// schedule of the steps.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include "actors/internal/pipeline_link.h"
#include "internal/host_offload.h"
#include "internal/overlap_backward.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/schedule.h"
#include "internal/shard_state.h"

#include <caf/logger.hpp>
#include <caf/scoped_actor.hpp>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

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

namespace internal {

Pipeline::Pipeline(std::vector<at::Tensor> model_params, GradScaler& s, AsyncOptimizerOptions o)
    : model(std::move(model_params)), scaler_(&s), options(std::move(o)) {
  // Every refusal first (internal/plan.h), then what the plan needs is built.
  plan = plan_pipeline(options, s, model);
  at::AutoGradMode no_grad(false);
  if (plan.masters == PipelinePlan::Masters::host_offload)
    offload = std::make_unique<HostOffload>(model);
  // Every rank's pipeline must shard alike, or their collectives would not pair up.
  if (const auto& ranks = s.options().ranks())
    ranks->require_same("pipeline options",
                        std::string("shard_optimizer_state=") + (plan.sharded ? "on" : "off"));
  make_masters();
  if (plan.swap) {  // the deferred steps' mailbox (defer_grad_move, fused steps)
    waiter = std::make_unique<caf::scoped_actor>(s.system());
    // CAF 0.17 pins the last system's logger to the thread; an actor system waits for every
    // such pin, so the scaler's could never go on another thread (as GradScaler does too).
    caf::logger::set_current_actor_system(nullptr);
  }
  if (const int n = options.optimizer_threads(); n > 0) set_team_size(s, n);
  if (plan.wait == PipelinePlan::Wait::overlapped) {
    overlap = std::make_unique<OverlapBackward>(s, model, buckets_for(options, model),
                                                options.ready_by_hooks(), options.clip_grad_norm(),
                                                offload.get(), shard.get());
    overlap->set_release([this] {
      // Its optimizer goes first (declared after the pipeline, say, and unwinding): the bucket
      // jobs queued with it run now, while it is whole.
      if (scaler_) scaler_->finish_jobs();
      overlap->forget_optimizer();
    });
  }
  place = make_placement(*this);
  schedule = make_schedule(*this);
  // Last: a constructor that throws leaves nothing registered. A scaler that goes first takes
  // its system, and so the scoped actor that waits in it.
  PipelineLink::on_gone(s, this, [this] {
    waiter.reset();
    scaler_ = nullptr;
  });
  tell_tap([](PipelineTap& t) { t.attached(); });
}

void Pipeline::make_masters() {
  if (plan.sharded) {
    // The model on a GPU: the shard's flat buffer holds the pinned host weights the offload
    // copies to it, filled from the model once here.
    std::vector<at::Tensor>* weights = &model;
    if (offload) {
      weights = &offload->host_weights();
      for (std::size_t i = 0; i < model.size(); ++i)
        (*weights)[i].copy_(model[i].detach());
    }
    shard = std::make_unique<ShardedState>(
        *weights, scaler_->options().ranks(), options.optim_dtype(),
        /*spare=*/plan.swap || plan.wait == PipelinePlan::Wait::overlapped,
        /*pinned=*/offload != nullptr);
    masters = shard->masters();
  } else {
    for (const at::Tensor& p : model) {
      masters.push_back(p.detach()
                            .to(plan.master_device, options.optim_dtype(), /*non_blocking=*/false,
                                /*copy=*/true)
                            .set_requires_grad(true));
      if (plan.swap) spare.push_back(p.detach().clone());
    }
  }
  for (const at::Tensor& m : masters)
    master_impls.insert(m.unsafeGetTensorImpl());
}

Pipeline::~Pipeline() {
  if (overlap) overlap->unlink();  // an optimizer that outlives it no longer calls it
  // The queued jobs run to their end before the masters and the optimizers it owns go, even
  // after a job's error (which the scaler reports). A scaler that went first ran them all.
  if (scaler_) {
    scaler_->finish_jobs();
    PipelineLink::forget(*scaler_, this);
  }
  tell_tap([](PipelineTap& t) { t.detached(); });  // after its last job's report
}

GradScaler& Pipeline::scaler() const {
  if (!scaler_)
    throw ScalerError(errc::protocol_misuse,
                      "AsyncOptimizer: its GradScaler was destroyed; a pipeline cannot step "
                      "without the scaler it was built with");
  return *scaler_;
}

void Pipeline::adopt(std::shared_ptr<torch::optim::Optimizer> opt) {
  check_optimizer(*opt);
  // overlap_backward steps the first fused optimizer made here from the first backward on.
  if (overlap && !overlap->optimizer() && optim::fused_step_of(*opt) &&
      OverlapBackward::holds_in_order(*opt, masters))
    overlap->use(*opt, masters);
  owned.push_back(std::move(opt));
}

}  // namespace internal

AsyncOptimizer::AsyncOptimizer(std::vector<at::Tensor> model_params, GradScaler& scaler,
                               AsyncOptimizerOptions options)
    : p_(std::make_unique<internal::Pipeline>(std::move(model_params), scaler,
                                              std::move(options))) {}

AsyncOptimizer::~AsyncOptimizer() = default;

const std::vector<at::Tensor>& AsyncOptimizer::optim_parameters() const {
  return p_->masters;
}

void AsyncOptimizer::adopt(std::shared_ptr<torch::optim::Optimizer> opt) {
  p_->adopt(std::move(opt));
}

void AsyncOptimizer::step(torch::optim::Optimizer& opt, std::function<void()> fn) {
  p_->scaler();  // a pipeline whose scaler is gone refuses before anything changes
  p_->check_optimizer(opt);
  p_->warn_uncleared_grads();
  p_->behind = p_->options.staleness() == 1;
  if (!p_->options.tap()) return p_->schedule->step(opt, std::move(fn));
  const auto t0 = std::chrono::steady_clock::now();
  const iteration_t k = p_->scaler().iteration();
  p_->schedule->step(opt, std::move(fn));
  p_->report_trainer(k, t0);
}

void AsyncOptimizer::sync() {
  p_->scaler();  // a pipeline whose scaler is gone refuses before anything changes
  p_->behind = false;
  p_->schedule->sync();
}

int AsyncOptimizer::staleness() const {
  return p_->options.staleness();
}

double AsyncOptimizer::grad_norm() const {
  return p_->grad_norm.load();
}

}  // namespace ampactor
