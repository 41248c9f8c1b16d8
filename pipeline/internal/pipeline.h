// The pipeline behind AsyncOptimizer's pimpl: its state, the placement of its masters
// (internal/placement.h) and the schedule of its steps (internal/schedule.h), both chosen once by
// the plan (internal/plan.h). What every schedule and placement shares is here. Not installed.
#pragma once

#include <ampactor/pipeline/async_optimizer.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "plan.h"

namespace caf {
class scoped_actor;
}

namespace ampactor::internal {

class HostOffload;
class OverlapBackward;
class ShardedState;
class Placement;
class Schedule;

struct Pipeline {
  Pipeline(std::vector<at::Tensor> model_params, GradScaler& scaler, AsyncOptimizerOptions o);
  ~Pipeline();

  /// The scaler; ScalerError(errc::protocol_misuse) once it is destroyed.
  GradScaler& scaler() const;
  /// Throws unless every parameter of opt is one of the masters.
  void check_optimizer(const torch::optim::Optimizer& opt) const;
  std::vector<at::Tensor> model_grads() const;
  /// A step's waited job (GradScaler::run_on_optimizer): with ranks, its error is told to the
  /// other ranks as a queued job's is, and this rank makes no further collective.
  void run_step(const std::function<void()>& fn);
  /// In a step's job, after the grads were taken: clip_grad_norm's clipping (the placement
  /// measures), then fn.
  void stepping(torch::optim::Optimizer& opt, const std::function<void()>& fn);
  /// Warns once on stderr when a model gradient is the last step's, accumulated onto once: the
  /// optimizer's zero_grad() (over the masters) was called instead of the model's.
  void warn_uncleared_grads();
  void adopt(std::shared_ptr<torch::optim::Optimizer> opt);
  /// The tap's reports (options.tap()): step() returning for iteration k after holding the
  /// trainer since `since`, and a step of k that took `step_s` on the optimizer thread.
  void report_trainer(std::int64_t k, std::chrono::steady_clock::time_point since);
  void report_optimizer(std::int64_t k, double step_s);
  /// Calls options.tap(), unless there is none or it threw before: a tap that throws is told
  /// nothing more (a line on stderr), and the pipeline goes on.
  void tell_tap(const std::function<void(PipelineTap&)>& f) noexcept;
  /// Which state this pipeline's masters are, as save() records it.
  std::string shard_text() const;

  /// What load() read, checked against this pipeline; applied by apply_load.
  struct Loaded {
    std::vector<at::Tensor> masters, spare;
    bool weights_behind = false;
    std::string setup;  // the thread counts and kernels it was written with ("": not recorded)
  };
  Loaded checked_load(torch::serialize::InputArchive& archive) const;
  void apply_load(const Loaded& l);

  std::vector<at::Tensor> model;
  std::vector<at::Tensor> masters;
  std::unordered_set<const void*> master_impls;  // to tell an optimizer over anything else
  std::vector<at::Tensor> spare;  // swap_weights: the buffer the model does not use now
  GradScaler* scaler_;            // null once the scaler is destroyed
  AsyncOptimizerOptions options;
  PipelinePlan plan;
  /// swap_weights: the mailbox where each deferred step's job says the spare is filled.
  std::unique_ptr<caf::scoped_actor> waiter;
  bool spare_pending = false;  // a job's word is still to come
  bool behind = false;         // staleness 1: the model's weights are a step behind the masters
  std::unique_ptr<HostOffload> offload;      // master_device CPU, the model elsewhere
  std::unique_ptr<ShardedState> shard;       // shard_optimizer_state
  std::unique_ptr<OverlapBackward> overlap;  // overlap_backward (reaches shard)
  std::unique_ptr<Placement> place;
  std::unique_ptr<Schedule> schedule;
  /// Each model gradient as step() last saw it (a weak reference: its address is not reused)
  /// and its version, to tell gradients never cleared since (warn_uncleared_grads).
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> last_grads;
  std::vector<std::int64_t> last_versions;
  bool warned_uncleared = false;
  std::atomic<double> grad_norm{std::numeric_limits<double>::quiet_NaN()};  // set by jobs
  std::vector<std::shared_ptr<torch::optim::Optimizer>> owned;  // make_optimizer's; go first
  std::atomic<bool> tap_dropped{false};  // the tap threw once: it is told nothing more
  std::optional<std::chrono::steady_clock::time_point> last_return;  // step()'s, trainer thread

 private:
  /// The masters in their place (the shard's when sharded), each an fp32 (or optim_dtype) copy
  /// of its parameter, and the spare weights with swap_weights.
  void make_masters();
};

}  // namespace ampactor::internal
