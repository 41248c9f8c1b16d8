// Where a pipeline's gradients go and its new weights come from (PipelinePlan::Masters, with
// sharding stacked on either): the masters on the model's device, on the host with the model on
// a GPU, or this rank's shard of them. Each placement is written once; the schedules
// (internal/schedule.h) drive it. Not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampactor::internal {

struct Pipeline;

/// Where a fused step (ampactor::optim) writes the weights it makes, in its own pass: nowhere
/// (the masters are copied after it), the model's weights or the spare ones.
enum class Into { none, model, spare };

class Placement {
 public:
  virtual ~Placement() = default;
  /// Whether a fused step of opt reads the grads where they are, checked only (so at staleness
  /// 1 its step must own them: the schedule defers), instead of the moved masters' grads.
  virtual bool checks_only(torch::optim::Optimizer& opt) const = 0;
  /// Whether a fused step of opt can write the weights `into` (Into) in its own pass.
  virtual bool writes_weights(torch::optim::Optimizer& opt) const = 0;
  /// In the step's job: the grads it reads (the host copies with the model on a GPU, waited for
  /// here; else `grads`).
  virtual std::vector<at::Tensor> receive(const std::vector<at::Tensor>& grads) { return grads; }
  /// In the step's job: `grads` into the masters' grads, unscaled and checked (UnscaleDone), or
  /// only checked for a step that reads them itself and writes `into`. adopt: the job owns them.
  virtual void take(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads, Into into,
                    bool adopt) = 0;
  /// In the step's job, after take: clip_grad_norm_'s clipping; returns the total norm (NaN for
  /// a step skipped for inf/NaN).
  virtual double clip(torch::optim::Optimizer& opt, double max_norm) = 0;
  /// In the step's job, after the step: its weights on their way to the model (written: the
  /// step wrote them already). failed: the step threw; only what a later exchange waits for.
  virtual void publish(bool written, bool failed) = 0;
  /// The masters -> the model's weights (a waited job, sync(), a load).
  virtual void to_model() = 0;
  /// swap_weights: the masters -> the spare weights (written: the step wrote them).
  virtual void fill_spare(bool written) = 0;
  /// swap_weights: the spare weights (the newest step) become the model's. Nothing else touches
  /// them meanwhile.
  virtual void swap_in() = 0;
  /// After a load at staleness 1: the loaded masters' weights staged for the next step's
  /// exchange (the model on a GPU); else nothing.
  virtual void stage_loaded() {}
};

/// The placements; make_placement picks one by the plan.
std::unique_ptr<Placement> device_placement(Pipeline& p);
std::unique_ptr<Placement> host_placement(Pipeline& p);
std::unique_ptr<Placement> shard_placement(Pipeline& p);  // on either place

/// The placement of p's plan (PipelinePlan::masters, sharded).
std::unique_ptr<Placement> make_placement(Pipeline& p);

}  // namespace ampactor::internal
