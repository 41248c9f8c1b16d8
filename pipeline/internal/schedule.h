// What the trainer waits for at AsyncOptimizer::step (PipelinePlan::Wait): the step itself, the
// last one (staleness 1: copied, swapped or with the grads moved in the job), the exchange with
// the host, or the buckets stepped during backward. Each schedule is written once over the
// placement (internal/placement.h). Not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampactor::internal {

struct Pipeline;

class Schedule {
 public:
  explicit Schedule(Pipeline& p) : p_(p) {}
  virtual ~Schedule() = default;
  /// Iteration k's step for opt (checked by the caller); fn is the optimizer math.
  virtual void step(torch::optim::Optimizer& opt, std::function<void()> fn) = 0;
  /// Waits for every queued step and brings the model's weights up to date with the masters.
  virtual void sync();

 protected:
  Pipeline& p_;
};

/// The step's job of the synchronous and the offload schedules: the grads received, taken
/// (UnscaleDone), the step (clipping, then fn), the weights published.
void step_job(Pipeline& p, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads,
              const std::function<void()>& fn);

/// The schedules; make_schedule picks one by the plan.
std::unique_ptr<Schedule> synchronous_schedule(Pipeline& p);
std::unique_ptr<Schedule> stale_schedule(Pipeline& p);
std::unique_ptr<Schedule> deferred_schedule(Pipeline& p);
std::unique_ptr<Schedule> offload_schedule(Pipeline& p);
std::unique_ptr<Schedule> overlapped_schedule(Pipeline& p);

/// The schedule of p's plan.
std::unique_ptr<Schedule> make_schedule(Pipeline& p);

}  // namespace ampactor::internal
