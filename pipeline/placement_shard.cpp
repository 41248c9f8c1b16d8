// This rank's shard of the masters (AsyncOptimizerOptions::shard_optimizer_state), stacked on
// the model's device or on the host offload: the grads are moved into the holders (one flat
// buffer), reduce-scattered so that this rank's shard holds the ranks' mean (the unsharded move's
// floats there), its pieces the masters' grads; the new weights reach every rank by an
// all-gather (a collective: every rank in turn). A fused step writes this rank's new weights in
// its own pass where nothing reads them meanwhile, and only the all-gather is left.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/optim/fused.h>
#include "actors/internal/pipeline_job.h"
#include "internal/host_offload.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/shard_state.h"

#include <ATen/core/grad_mode.h>

#include <limits>

namespace ampactor::internal {

namespace {

class ShardPlacement : public Placement {
 public:
  explicit ShardPlacement(Pipeline& p) : p_(p), shard_(*p.shard), offload_(p.offload.get()) {}

  bool checks_only(torch::optim::Optimizer&) const override { return false; }
  bool writes_weights(torch::optim::Optimizer& opt) const override {
    return optim::fused_step_of(opt) != nullptr;
  }

  std::vector<at::Tensor> receive(const std::vector<at::Tensor>& grads) override {
    if (!offload_) return grads;
    std::vector<at::Tensor> host = offload_->receive_grads();
    offload_->weights_to_write();  // waits until the last exchange has read them
    return host;
  }

  void take(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads, Into into,
            bool adopt) override {
    std::vector<at::Tensor> holders = shard_.holders();
    PipelineJob job(*JobContext::current());
    shard_.prepare_grads();
    job.move_and_unscale_(opt, grads, holders, adopt, shard_.reducer());
    shard_.attach_grads();
    if (into != Into::none && writes_weights(opt))
      job.write_weights_in_step(opt, shard_.step_weights(into == Into::spare));
  }

  /// Over the ranks' mean gradient (each rank measures its shard), applied to it.
  double clip(torch::optim::Optimizer& opt, double max_norm) override {
    if (JobContext::current()->found_inf(opt).value_or(true))
      return std::numeric_limits<double>::quiet_NaN();  // skipped: nothing clipped
    return shard_.clip(max_norm);
  }

  void publish(bool written, bool failed) override {
    if (!offload_) {
      if (!failed) shard_.gather(p_.model, written);
      return;
    }
    if (!failed) return stage(written);
    try {  // the masters' weights all the same, as the unsharded offload stages them
      stage(/*written=*/false);
    } catch (...) {  // the group failed: the step's error is the one to report
    }
  }

  void to_model() override {
    if (!offload_) return shard_.gather(p_.model);
    // Into the pinned host weights (a collective), then to the model.
    shard_.gather(offload_->weights_to_write());
    at::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < p_.model.size(); ++i)
      p_.model[i].detach().copy_(offload_->host_weights()[i]);
  }

  void fill_spare(bool written) override { shard_.gather_spare(written); }
  void swap_in() override { shard_.swap(p_.model); }
  void stage_loaded() override {
    if (offload_) stage(/*written=*/false);
  }

 private:
  /// Every rank's shard into the pinned host weights (a collective; written: this rank's slot
  /// holds its step's weights already), staged for the next exchange.
  void stage(bool written) {
    shard_.gather(offload_->weights_to_write(), written);
    offload_->weights_written();
  }

  Pipeline& p_;
  ShardedState& shard_;
  HostOffload* offload_;
};

}  // namespace

std::unique_ptr<Placement> shard_placement(Pipeline& p) {
  return std::make_unique<ShardPlacement>(p);
}

}  // namespace ampactor::internal
