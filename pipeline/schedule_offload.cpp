// The host offload's schedule (the model on a GPU, the masters on the CPU): the grads leave for
// the pinned host buffers and the weights come back from them on two CUDA streams of their own,
// ordered by events. The grad move always runs in the step's job; at staleness 1 step() waits
// for the previous step's job, then queues the copies (its weights and this step's grads cross at
// once, behind this backward) and returns.
#include <ampactor/actors/grad_scaler.h>
#include "internal/host_offload.h"
#include "internal/pipeline.h"
#include "internal/schedule.h"

namespace ampactor::internal {

namespace {

class Offload : public Schedule {
 public:
  using Schedule::Schedule;

  void step(torch::optim::Optimizer& opt, std::function<void()> fn) override {
    const std::vector<at::Tensor> grads = p_.model_grads();
    auto job = [this, &opt, fn = std::move(fn)] { step_job(p_, opt, {}, fn); };
    HostOffload& o = *p_.offload;
    if (p_.options.staleness() == 0) {
      o.exchange(&grads, nullptr);
      p_.run_step(job);
      o.exchange(nullptr, &p_.model);
      return;
    }
    // The previous job has staged step k-1's weights and read the host grads once this returns
    // (FIFO).
    p_.scaler().run_on_optimizer([] {});
    o.exchange(&grads, &p_.model);
    p_.scaler().submit(std::move(job), SubmitOptions().unscales(UnscalePermit::exactly(1)));
  }

  void sync() override {
    p_.scaler().run_on_optimizer([] {});
    p_.offload->exchange(nullptr, &p_.model);
  }
};

}  // namespace

std::unique_ptr<Schedule> offload_schedule(Pipeline& p) {
  return std::make_unique<Offload>(p);
}

}  // namespace ampactor::internal
