// What a pipeline (AsyncOptimizer) tells an observer of each iteration's timing: the trainer's
// side from step(), the optimizer's side from the step's job. Torch-free; the metrics library
// (<ampactor/metrics/metrics.h>) is one such observer. Calls come on the trainer's and the
// optimizer's threads, concurrently: an implementation locks.
#pragma once

#include <cstdint>

namespace ampactor {

class PipelineTap {
 public:
  virtual ~PipelineTap() = default;
  /// A pipeline was built with this tap: from now on it reports every iteration it steps.
  virtual void attached() {}
  /// That pipeline is gone: wait for its reports no more.
  virtual void detached() {}
  /// Trainer thread, as step() for iteration k returns: how long step() held the trainer (the
  /// wait for the optimizer's earlier work, and the copies step() makes), and the time since
  /// the previous step() returned (NaN for the first).
  virtual void trainer_step(std::int64_t k, double held_s, double iteration_s) = 0;
  /// Optimizer thread, as iteration k's step ends (also when it skipped for inf/NaN): how long
  /// the step took there (clipping and the optimizer's step), and clip_grad_norm's total norm
  /// (NaN where not measured).
  virtual void optimizer_step(std::int64_t k, double step_s, double grad_norm) = 0;
};

}  // namespace ampactor
