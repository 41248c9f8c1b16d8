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
// - update() from any other thread, the optimizer thread included, raises torch's text.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ampactor/messages/messages.h>
#include <ampactor/scaler/errors.h>
#include <ampactor/scaler/options.h>
#include <ampactor/scaler/stage.h>
#include <ampactor/scaler/state_dict.h>

namespace caf {
class actor_system;
class actor;
}  // namespace caf

namespace torch::optim {
class Optimizer;
}

namespace ampactor {

struct ScalerActors;

/// Everything about one closed iteration's steps (see IterationDone).
using IterationResult = IterationDone;

class GradScaler {
 public:
  using LossClosure = std::function<at::Tensor()>;

  /// Owns a small actor system of its own.
  /// trace_path: when not empty, every message to and from the scale keeper is recorded there as
  /// a trace (JSON Lines, README "Traces"; replay with ampactor-replay). The file is created (or
  /// truncated) here, std::runtime_error if it cannot be, and complete once the scaler is
  /// destroyed.
  explicit GradScaler(const GradScalerOptions& opts = {}, ScalePolicy policy = ScalePolicy::exact,
                      const std::string& trace_path = {});
  /// torch's positional constructor. The values go through GradScalerOptions' setters, so one no
  /// scaler could hold (e.g. a NaN factor) is refused even when disabled.
  GradScaler(double init_scale, double growth_factor = 2.0, double backoff_factor = 0.5,
             std::int64_t growth_interval = 2000, bool enabled = true);
  /// Lives in the caller's actor system (which must outlive the scaler). Call
  /// register_messages(cfg) on its config for readable errors.
  GradScaler(caf::actor_system& sys, const GradScalerOptions& opts = {},
             ScalePolicy policy = ScalePolicy::exact, const std::string& trace_path = {});
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
  bool is_enabled() const;
  /// A consistent snapshot: every update sent before it is applied first.
  StateDict state_dict();
  void load_state_dict(const StateDict& sd);

  // ---- ampactor ----
  /// Queues `fn` as a step job of the current iteration on the optimizer thread and returns at
  /// once. Inside fn, unscale_/step/get_scale act with this iteration's scale. An exception from
  /// fn abandons the iteration's update (the scale stays, as in torch when step() throws) and is
  /// rethrown on the main thread by the next unscale_/step (before they act), update (after it
  /// acts) or sync.
  /// may_unscale=false: fn only steps optimizers already unscaled in this iteration (e.g. by
  /// run_on_optimizer), so update() knows the unscale count and never waits for fn; an unscale
  /// inside fn is refused.
  /// counted_unscales (with may_unscale=false): fn unscales exactly this many optimizers itself
  /// (e.g. a deferred grad move). update() counts them in advance, so the keeper applies the
  /// update as soon as they arrive, not when fn ends; any further unscale in fn is refused. If fn
  /// fails (or is cancelled) before making them, the iteration's update changes nothing.
  void submit(std::function<void()> fn, bool may_unscale = true, std::int32_t counted_unscales = 0);
  /// Runs fn as a step job of the current iteration on the optimizer thread and waits for it. An
  /// exception from fn is rethrown here as it was thrown.
  void run_on_optimizer(const std::function<void()>& fn);
  /// Waits until every queued job and update has run; rethrows a job's error.
  void sync();
  /// Drops the queued jobs that have not started; their iterations' updates change nothing.
  /// Returns at once; sync() waits for the running one.
  void cancel();
  /// The current iteration (update() closes it).
  iteration_t iteration() const;
  /// The steps of a closed iteration, without waiting; nullopt while the optimizer is still on it.
  /// The last `result_history` iterations are kept.
  std::optional<IterationResult> poll_result(iteration_t k);
  /// The same, waiting for the optimizer. An iteration that is not closed yet:
  /// errc::iteration_open.
  IterationResult wait_result(iteration_t k);
  /// Sends every StepResult and IterationDone (optimizer) and UpdateApplied (keeper) to `who`.
  void subscribe(const caf::actor& who);
  /// Where the optimizer stands with this optimizer in the current iteration (main thread: after
  /// the jobs queued so far).
  std::optional<bool> found_inf(const torch::optim::Optimizer& optimizer);
  ScalePolicy policy() const;
  const GradScalerOptions& options() const;
  /// Where the keeper's trace goes; empty when not recording.
  const std::string& trace_path() const;
  /// The actors behind the scaler, for a trainer of one's own.
  const ScalerActors& actors() const;

  static constexpr std::size_t result_history = 4096;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ampactor
