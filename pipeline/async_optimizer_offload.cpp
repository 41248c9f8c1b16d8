// AsyncOptimizer's step with the model on a GPU and the masters on the CPU (master_device): the
// grads and the weights cross through HostOffload's pinned buffers, the step runs on the CPU.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/pipeline/async_optimizer.h>
#include "actors/internal/pipeline_job.h"
#include "internal/host_offload.h"

namespace ampactor {

void AsyncOptimizer::step_offload(torch::optim::Optimizer& opt, std::function<void()> fn) {
  // One job: the grads arrive (this thread alone waits for them) and are checked and unscaled on
  // the CPU, which reports UnscaleDone; fn steps, and the new weights are staged for the trainer,
  // even when fn fails (as the spare is in step()). The CPU's fp16 -> fp32 move does the check
  // and the unscale in one pass; a fused optimizer instead checks the pinned grads, reads them
  // in its step and writes the pinned weights in place: no fp32 grads, no separate cast.
  // Sharded, the job's own (sharded_offload_job).
  std::function<void()> job;
  if (shard_)
    job = sharded_offload_job(opt, std::move(fn));
  else
    job = [this, &opt, fn = std::move(fn)] {
      const std::vector<at::Tensor> grads = offload_->receive_grads();
      JobContext* ctx = JobContext::current();
      const bool fused = fuses(opt);
      try {
        if (fused)
          internal::PipelineJob(*ctx).check_for_fused_(opt, grads, masters_,
                                                       offload_->weights_to_write());
        else
          internal::PipelineJob(*ctx).move_and_unscale_(opt, grads, masters_);
        if (fn) fn();
      } catch (...) {
        offload_->stage_weights(masters_);
        throw;
      }
      if (fused && internal::PipelineJob(*ctx).wrote_weights(opt))
        offload_->weights_written();
      else
        offload_->stage_weights(masters_);
    };
  const std::vector<at::Tensor> grads = model_grads();
  if (options_.staleness() == 0) {
    offload_->exchange(&grads, nullptr);
    run_step(job);
    offload_->exchange(nullptr, &model_);
    return;
  }
  // The previous job has staged step k-1's weights and read the host grads once this returns
  // (FIFO); its weights and this step's grads then cross at once, behind this backward.
  scaler().run_on_optimizer([] {});
  offload_->exchange(&grads, &model_);
  scaler().submit(std::move(job), SubmitOptions().unscales(UnscalePermit::exactly(1)));
}

}  // namespace ampactor
