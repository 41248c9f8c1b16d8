// The synchronous schedule (staleness 0): step() queues the step's job and waits for it. The job
// takes the grads, steps and publishes the weights to the model; the schedules share its body
// (step_job), and every schedule's sync().
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include "actors/internal/pipeline_job.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/schedule.h"

namespace ampactor::internal {

void step_job(Pipeline& p, torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads,
              const std::function<void()>& fn) {
  const std::vector<at::Tensor> received = p.place->receive(grads);
  try {
    p.place->take(opt, received, Into::model, /*adopt=*/false);
    p.stepping(opt, fn);
  } catch (...) {
    p.place->publish(/*written=*/false, /*failed=*/true);
    throw;
  }
  p.place->publish(PipelineJob(*JobContext::current()).wrote_weights(opt), /*failed=*/false);
}

void Schedule::sync() {
  p_.scaler().run_on_optimizer([&] { p_.place->to_model(); });
}

namespace {

class Synchronous : public Schedule {
 public:
  using Schedule::Schedule;
  void step(torch::optim::Optimizer& opt, std::function<void()> fn) override {
    const std::vector<at::Tensor> grads = p_.model_grads();
    p_.run_step([&] { step_job(p_, opt, grads, fn); });
  }
};

}  // namespace

std::unique_ptr<Schedule> synchronous_schedule(Pipeline& p) {
  return std::make_unique<Synchronous>(p);
}

}  // namespace ampactor::internal
