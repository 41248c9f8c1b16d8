// The masters on the model's device (PipelinePlan::Masters::model_device), and on the host with
// the model on a GPU (host_offload: the grads and the weights cross through HostOffload's pinned
// buffers). A fused optimizer (ampactor::optim) reads the model's grads in its step and writes the
// weights in the same pass: the job checks the grads (UnscaleDone) instead of moving them. Not
// with ranks: their mean is made in fp32 by the move, and the fused step then reads the masters'.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/optim/fused.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>
#include "actors/internal/pipeline_job.h"
#include "internal/host_offload.h"
#include "internal/pipeline.h"
#include "internal/placement.h"

#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <stdexcept>
#include <unordered_map>

namespace ampactor::internal {

namespace {

PipelineJob job() {
  return PipelineJob(*JobContext::current());
}

/// Data parallel: the squares of opt's gradients (param-group order, one per defined one), each
/// master's measured by the pieces the sharded layout over `masters` (the model's order) would
/// cut it into, so that sharded and unsharded ranks clip alike (piece_square).
std::vector<double> rank_squares(const torch::optim::Optimizer& opt,
                                 const std::vector<at::Tensor>& masters, int world) {
  std::vector<std::int64_t> numels;
  std::unordered_map<const void*, std::size_t> index;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    numels.push_back(masters[i].numel());
    index.emplace(masters[i].unsafeGetTensorImpl(), i);
  }
  const ShardLayout layout(numels, world);
  std::vector<double> squares;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      const auto at = index.find(p.unsafeGetTensorImpl());
      squares.push_back(at == index.end() ? squared_norm(g) : piece_square(g, layout, at->second));
    }
  return squares;
}

class DevicePlacement : public Placement {
 public:
  explicit DevicePlacement(Pipeline& p) : p_(p) {}

  bool checks_only(torch::optim::Optimizer& opt) const override {
    return optim::fused_step_of(opt) != nullptr && !p_.scaler().options().ranks();
  }
  bool writes_weights(torch::optim::Optimizer& opt) const override { return checks_only(opt); }

  void take(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads, Into into,
            bool adopt) override {
    if (checks_only(opt))
      job().check_for_fused_(opt, grads, p_.masters, weights(into));
    else
      job().move_and_unscale_(opt, grads, p_.masters, adopt);
  }

  double clip(torch::optim::Optimizer& opt, double max_norm) override {
    // The moved grads are opt's own (no fused check) with ranks.
    const std::shared_ptr<RankGroup>& ranks = p_.scaler().options().ranks();
    if (!ranks || ranks->size() == 1) return JobContext::current()->clip_grad_norm_(opt, max_norm);
    const std::vector<double> squares = rank_squares(opt, p_.masters, ranks->size());
    return JobContext::current()->clip_grad_norm_(opt, max_norm, &squares);
  }

  void publish(bool written, bool failed) override {
    if (!failed && !written) to_model();
  }

  void to_model() override {
    at::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < p_.model.size(); ++i)
      p_.model[i].detach().copy_(p_.masters[i]);
  }

  void fill_spare(bool written) override {
    if (written) return;
    at::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < p_.spare.size(); ++i)
      p_.spare[i].copy_(p_.masters[i]);
  }

  void swap_in() override {
    // The trainer waits meanwhile, and backward is over: nothing reads the parameters' storage.
    for (std::size_t i = 0; i < p_.model.size(); ++i) {
      at::Tensor old = p_.model[i].variable_data();  // the storage the model used until now
      p_.model[i].set_data(p_.spare[i]);
      p_.spare[i] = std::move(old);
    }
  }

 protected:
  Pipeline& p_;

 private:
  std::vector<at::Tensor> weights(Into into) const {
    return into == Into::model   ? p_.model
           : into == Into::spare ? p_.spare
                                 : std::vector<at::Tensor>{};
  }
};

/// The masters on the host, the model on a GPU: the grads arrive in the pinned host buffers (the
/// step's job alone waits for them), are checked and unscaled on the CPU in the fp16 -> fp32
/// move's one pass, and the new weights are staged there for the next exchange; a fused step
/// checks the pinned grads, reads them in its step and writes the pinned weights in place.
class HostPlacement : public DevicePlacement {
 public:
  using DevicePlacement::DevicePlacement;

  std::vector<at::Tensor> receive(const std::vector<at::Tensor>&) override {
    return p_.offload->receive_grads();
  }
  void take(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads, Into,
            bool) override {
    if (checks_only(opt))
      job().check_for_fused_(opt, grads, p_.masters, p_.offload->weights_to_write());
    else
      job().move_and_unscale_(opt, grads, p_.masters);
  }
  /// Staged even when the step failed: the next exchange waits for them.
  void publish(bool written, bool failed) override {
    if (written && !failed)
      p_.offload->weights_written();
    else
      p_.offload->stage_weights(p_.masters);
  }
  void fill_spare(bool) override { no_spare(); }
  void swap_in() override { no_spare(); }
  void stage_loaded() override { p_.offload->stage_weights(p_.masters); }

 private:
  [[noreturn]] static void no_spare() {
    throw std::logic_error(
        "AsyncOptimizer: the host offload has no spare weights (the plan "
        "refuses swap_weights with it)");
  }
};

}  // namespace

std::unique_ptr<Placement> device_placement(Pipeline& p) {
  return std::make_unique<DevicePlacement>(p);
}

std::unique_ptr<Placement> host_placement(Pipeline& p) {
  return std::make_unique<HostPlacement>(p);
}

}  // namespace ampactor::internal
