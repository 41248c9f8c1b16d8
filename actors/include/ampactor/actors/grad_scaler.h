// ampactor::GradScaler: torch.amp.GradScaler for LibTorch, backed by actors, so the optimizer can
// run on its own thread (RoundPipe's asynchronous optimizer) without ever mixing up the scale a
// loss was scaled with and the scale its gradients are unscaled with.
//
// Thread rules:
// - The thread that constructs the scaler is its main thread. scale, unscale_, step, update,
//   the getters, setters, state_dict and sync are called there.
// - step()/unscale_() on the main thread are queued on the optimizer actor and waited for; inside
//   a step job (submit) they run directly on the optimizer thread, with the scale the job's
//   gradients were made with. get_scale() follows the same rule.
// - update() from any other thread, the optimizer thread included, raises
//   errc::update_off_main_thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/core/overflow.h>
#include <ampactor/core/stage.h>
#include <ampactor/core/state_dict.h>
#include <ampactor/keeper/keeper_core.h>
#include <ampactor/keeper/protocol.h>

namespace caf {
class actor_system;
}  // namespace caf

namespace torch::optim {
class Optimizer;
}
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ampactor {
namespace internal {
struct PipelineLink;
}

struct ScalerActors;
class AsyncOptimizer;

/// Everything about one closed iteration's steps (see IterationDone).
using IterationResult = IterationDone;

/// submit()'s options, as chainable setters.
class SubmitOptions {
 public:
  /// What the job may unscale (default UnscalePermit::any()): none() when it only steps
  /// optimizers already unscaled in this iteration (e.g. by run_on_optimizer), so update() knows
  /// the unscale count and never waits for the job; exactly(n) when it unscales n optimizers
  /// itself (e.g. a deferred grad move), which update() counts in advance, so the keeper applies
  /// the update as soon as they arrive, not when the job ends. Any further unscale in the job is
  /// refused (errc::protocol_misuse); a job that fails or is cancelled before making its n leaves
  /// the iteration's update changing nothing.
  SubmitOptions& unscales(UnscalePermit permit) {
    permit_ = permit;
    return *this;
  }
  const UnscalePermit& unscales() const { return permit_; }

 private:
  UnscalePermit permit_ = UnscalePermit::any();
};

class GradScaler {
 public:
  using LossClosure = std::function<at::Tensor()>;

  /// Owns a small actor system of its own. `opts` is the scale rule (as LocalGradScaler's);
  /// `keeper` how its keeper runs: the policy, and a tap that sees every message to and from the
  /// keeper, e.g. a trace recorder (ampactor::record_trace(path) from <ampactor/trace/trace.h>,
  /// in the ampactor::trace library; replay with ampactor-replay). The tap hears stopped() before
  /// the destructor returns.
  explicit GradScaler(const GradScalerOptions& opts = {}, const KeeperOptions& keeper = {});
  /// The positional form of 0.2, kept one release: KeeperOptions().policy(policy).tap(tap).
  GradScaler(const GradScalerOptions& opts, ScalePolicy policy,
             std::shared_ptr<KeeperTap> tap = nullptr);
  /// torch's positional constructor. The values go through GradScalerOptions' setters, so one no
  /// scaler could hold (e.g. a NaN factor) is refused even when disabled.
  GradScaler(double init_scale, double growth_factor = 2.0, double backoff_factor = 0.5,
             std::int64_t growth_interval = 2000, bool enabled = true);
  /// Lives in the caller's actor system (which must outlive the scaler). Call
  /// register_messages(cfg) on its config for readable errors.
  GradScaler(caf::actor_system& sys, const GradScalerOptions& opts = {},
             const KeeperOptions& keeper = {});
  /// The positional form of 0.2, kept one release.
  GradScaler(caf::actor_system& sys, const GradScalerOptions& opts, ScalePolicy policy,
             std::shared_ptr<KeeperTap> tap = nullptr);
  /// Waits for queued step jobs (or drops them after cancel()) and stops the actors. An error
  /// no call has reported yet is written to stderr, never lost in silence.
  ~GradScaler();
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // ---- torch.amp.GradScaler ----
  /// outputs * the scale of the current iteration (inside a step job: the job's scale).
  at::Tensor scale(const at::Tensor& outputs);
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Returns optimizer.step()'s value, or nullopt when skipped.
  std::optional<at::Tensor> step(torch::optim::Optimizer& optimizer, LossClosure closure = nullptr);
  /// Main thread only. Never waits for the optimizer: the keeper applies the update once the
  /// iteration's unscale reports are in.
  void update();
  void update(double new_scale);
  void update(const at::Tensor& new_scale);
  /// Main thread: the scale of the current iteration. Inside a step job: the scale that job's
  /// gradients were made with. 1.0 when disabled.
  double get_scale();
  double get_growth_factor(bool up_to_date = false);
  double get_backoff_factor(bool up_to_date = false);
  std::int64_t get_growth_interval(bool up_to_date = false);
  /// Setters are checked here (torch's texts) and applied by the keeper in order, after the
  /// updates sent before them. They do not wait.
  void set_growth_factor(double v);
  void set_backoff_factor(double v);
  void set_growth_interval(std::int64_t v);
  /// Any thread, inside step jobs too: fixed at construction.
  bool is_enabled() const;
  /// A consistent snapshot: every update sent before it is applied first.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);
  /// state_dict() into `archive` (torch::save(scaler, f) with <ampactor/actors/checkpoint.h>).
  /// Steps in flight are not waited for, but the snapshot holds every update() made before the
  /// call, so a checkpoint written at the same point of the loop always holds the same scale.
  void save(torch::serialize::OutputArchive& archive) const;
  /// What save() (or LocalGradScaler::save) wrote, checked as load_state_dict: on an error
  /// nothing changes.
  void load(torch::serialize::InputArchive& archive);

  // ---- ampactor ----
  /// Queues `fn` as a step job of the current iteration on the optimizer thread and returns at
  /// once. Inside fn, unscale_/step/get_scale act with this iteration's scale. An exception from
  /// fn abandons the iteration's update (the scale stays, as in torch when step() throws) and is
  /// rethrown on the main thread by the next unscale_/step (before they act), update (after it
  /// acts) or sync. An empty fn: ScalerError(errc::bad_option). See SubmitOptions.
  void submit(std::function<void()> fn, const SubmitOptions& options = {});
  /// Runs fn as a step job of the current iteration on the optimizer thread and waits for it. An
  /// exception from fn is rethrown here as it was thrown.
  void run_on_optimizer(const std::function<void()>& fn);
  /// Waits until every queued job and update has run; rethrows a job's error.
  void sync();
  /// Waits until every queued job has run and throws nothing: a job's error stays for sync(),
  /// wait_result() or the destructor to report. For the ways out of a scope.
  void finish_jobs() noexcept;
  /// Drops the queued jobs that have not started; their iterations' updates change nothing.
  /// Returns at once; sync() waits for the running one.
  void cancel();
  /// The current iteration (update() closes it). Main thread only (errc::wrong_thread).
  iteration_t iteration() const;
  /// The steps of a closed iteration, without waiting; nullopt while the optimizer is still on it.
  /// The last `result_history` iterations are kept.
  std::optional<IterationResult> poll_result(iteration_t k);
  /// The same, waiting for the optimizer. An iteration that is not closed yet:
  /// errc::iteration_open.
  IterationResult wait_result(iteration_t k);
  /// Where the optimizer stands with this optimizer in the current iteration (main thread: after
  /// the jobs queued so far).
  std::optional<bool> found_inf(const torch::optim::Optimizer& optimizer);
  ScalePolicy policy() const;
  const GradScalerOptions& options() const;
  /// The keeper's tap, if any.
  const std::shared_ptr<KeeperTap>& tap() const;
  /// Why the tap records no more (a trace that could not be written), or "" while it records
  /// (or without a tap). With KeeperOptions::raise_tap_failure the next unscale_, step, update
  /// or sync after the failure also throws it, once.
  std::string tap_failure() const;
  /// Names the parameters in the overflow reports (model->named_parameters(); several calls add
  /// up; any thread). Unnamed ones are "param <index>", their index in their optimizer.
  GradScaler& name_parameters(const torch::OrderedDict<std::string, at::Tensor>& named);
  /// The newest closed iteration whose unscale found inf or NaN, as the optimizer has reported
  /// it so far (no wait): which gradients held them, by name (also wait_result(k).overflow).
  /// nullopt before any. Main thread only.
  std::optional<OverflowReport> last_overflow();
  /// The actors behind the scaler, for a trainer of one's own or a monitor
  /// (subscribe(actors(), who) in <ampactor/actors/optimizer_actor.h>).
  const ScalerActors& actors() const;
  /// The actor system the scaler's actors live in: its own, or the one it was given.
  caf::actor_system& system() const;

  static constexpr std::size_t result_history = 4096;

 private:
  friend struct internal::PipelineLink;  // the pipeline's calls (actors/internal/pipeline_link.h)
  /// A step job queued from the thread that runs backward (a GPU's autograd thread) while the
  /// main thread waits in backward(), for the iteration's known scale; false, nothing queued,
  /// where the scale is not known yet or the scaler is disabled.
  bool submit_from_backward(std::function<void()> fn);
  /// What lives over this scaler (a pipeline, main thread): `gone` is told when the scaler goes,
  /// after its jobs, once, unless `who` is forgotten first; it runs in the scaler's destructor,
  /// so it must not throw. The scaler names no pipeline: the pipeline library sits above this one.
  void on_gone(const void* who, std::function<void()> gone);
  void forget(const void* who) noexcept;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Waits for the queued jobs when its scope ends. Deprecated: a pipeline that owns its optimizer
/// (AsyncOptimizer::make_optimizer) needs no declaration order; kept, working, for one release.
namespace internal {
class FinishJobsGuard {
 public:
  explicit FinishJobsGuard(GradScaler& scaler) : scaler_(scaler) {}
  ~FinishJobsGuard() { scaler_.finish_jobs(); }
  FinishJobsGuard(const FinishJobsGuard&) = delete;
  FinishJobsGuard& operator=(const FinishJobsGuard&) = delete;

 private:
  GradScaler& scaler_;
};
}  // namespace internal

using FinishJobs
    [[deprecated("let the pipeline own the optimizer: pipe.make_optimizer<Opt>(...)")]] =
        internal::FinishJobsGuard;

}  // namespace ampactor
