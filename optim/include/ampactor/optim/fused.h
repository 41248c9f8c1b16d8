// Fused scaled optimizer steps on the CPU: Adam, AdamW and SGD over fp32 masters that read the
// model's gradients in their own dtype (fp16, bf16 or fp32), unscale them, update the masters and
// the optimizer's state and write the model's weights in their dtype, in one pass per tensor.
//
// Each is a subclass of its torch::optim optimizer: the same options, param groups, state and
// save/load (a checkpoint of torch::optim::AdamW loads into FusedAdamW and back), and the same
// result bit for bit (doc/guide/fused-optimizers.md). Like torch's fused optimizers with
// torch.amp.GradScaler, they take the iteration's scale and found_inf: the GradScalers hand them
// over, so no separate unscale pass runs and a step with inf/NaN is skipped inside.
#pragma once

#include <ATen/core/Tensor.h>

#include <ampactor/core/arg.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace ampactor::optim {

/// The fused optimizers' own settings: FusedOptions().threads(1).
class FusedOptions {
  /// Threads of the step's one parallel region; 0: LibTorch's intra-op thread count of the
  /// thread that steps, at each step. >= 0 (else ScalerError(errc::bad_option)).
  AMPACTOR_ARG(int, threads, 0);
};

/// What one scaled step reads and writes: ScaledStep().inv_scale(1 / s).found_inf(t).
class ScaledStep {
  /// The inverse of the scale the gradients were made at (1: they are not scaled). Finite > 0.
  AMPACTOR_ARG(float, inv_scale, 1.0f);
  /// A 1-element fp32 CPU tensor. Nonzero: the step is skipped and changes nothing (no master,
  /// state, step count or weight). Undefined: never skipped; pass one unless the gradients are
  /// known to be finite (the GradScalers' check fills it).
  AMPACTOR_ARG_ANY(at::Tensor, found_inf, {});
  /// One gradient per parameter, in the order of the param groups (undefined: that parameter
  /// has none and is left alone, as torch::optim leaves a parameter without a grad). Empty: each
  /// parameter's own grad(). fp32, fp16 or bf16 (fp64 with fp64 parameters), on the CPU, the
  /// parameter's shape.
  AMPACTOR_ARG_ANY(std::vector<at::Tensor>, grads, {});
  /// One model weight per parameter, same order and shape, fp32, fp16 or bf16 (fp64 with fp64
  /// parameters), that a step which is not skipped leaves holding its parameter in the weight's
  /// dtype (rounded to nearest even; a parameter without a gradient is copied). Empty: none.
  AMPACTOR_ARG_ANY(std::vector<at::Tensor>, weights, {});
};

namespace detail {
struct Speculation;
}

/// The interface the GradScalers and AsyncOptimizer look for (torch's
/// `_step_supports_amp_scaling`).
class FusedStep {
 public:
  virtual ~FusedStep();
  /// One step. Returns false when found_inf skipped it. Bad input (see ScaledStep) throws
  /// ScalerError (errc::bad_parameters or errc::invalid_gradients) and changes nothing.
  /// A parameter with a speculative step (speculate()) made from the same inputs takes it by
  /// swapping buffers (no second pass); every other speculative step is dropped.
  virtual bool step_scaled(const ScaledStep& step) = 0;
  /// A speculative step of the parameters `step` gives gradients for (the others are left
  /// alone): computed from the live masters and state as step_scaled would, written into a
  /// second buffer (the live ones are only read), and the weights given written. The next
  /// step_scaled takes it where its inputs match (the same gradient and weight tensors, scale,
  /// hyperparameters and step count); drop_speculation() discards it, leaving every master,
  /// state and step count as it was. Masters on the exact path (fp64, non-contiguous) are not
  /// speculated: step_scaled steps them. Nothing is speculated when found_inf is set. The
  /// second buffer is kept for reuse: speculation_bytes(). Bad input: as step_scaled.
  virtual void speculate(const ScaledStep& step) = 0;
  /// Discards the pending speculative steps (no-op without any).
  void drop_speculation();
  bool speculation_pending() const;
  /// Bytes held by the second buffer (masters and state of the parameters ever speculated).
  std::int64_t speculation_bytes() const;
  const FusedOptions& fused_options() const noexcept { return fused_; }
  /// `f` (or none) is called as this optimizer starts to go, before any of it goes: a pipeline
  /// that queues speculative steps of it (overlap_backward) runs them first, so that none steps
  /// a destroyed optimizer, whatever order the two were declared in.
  void on_release(std::function<void()> f) { release_ = std::move(f); }

 protected:
  /// Calls the on_release function once: each fused optimizer's destructor does it first.
  void release() noexcept;
  explicit FusedStep(FusedOptions fused);
  FusedOptions fused_;
  std::unique_ptr<detail::Speculation> spec_;

 private:
  std::function<void()> release_;
};

/// torch::optim::Adam, fused (amsgrad included).
class FusedAdam : public torch::optim::Adam, public FusedStep {
 public:
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> groups,
                     torch::optim::AdamOptions defaults = {}, FusedOptions fused = {});
  explicit FusedAdam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults = {},
                     FusedOptions fused = {});
  /// A plain step on each parameter's own grad (scale 1, never skipped); the closure as torch's.
  at::Tensor step(LossClosure closure = nullptr) override;
  bool step_scaled(const ScaledStep& step) override;
  void speculate(const ScaledStep& step) override;
  ~FusedAdam() override;
};

/// torch::optim::AdamW, fused (amsgrad included).
class FusedAdamW : public torch::optim::AdamW, public FusedStep {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                      torch::optim::AdamWOptions defaults = {}, FusedOptions fused = {});
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {},
                      FusedOptions fused = {});
  at::Tensor step(LossClosure closure = nullptr) override;
  bool step_scaled(const ScaledStep& step) override;
  void speculate(const ScaledStep& step) override;
  ~FusedAdamW() override;
};

/// torch::optim::SGD, fused (momentum, dampening, nesterov, weight decay).
class FusedSGD : public torch::optim::SGD, public FusedStep {
 public:
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> groups,
                    torch::optim::SGDOptions defaults, FusedOptions fused = {});
  explicit FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults,
                    FusedOptions fused = {});
  at::Tensor step(LossClosure closure = nullptr) override;
  bool step_scaled(const ScaledStep& step) override;
  void speculate(const ScaledStep& step) override;
  ~FusedSGD() override;
};

/// The FusedStep of `opt`, or null for any other optimizer.
FusedStep* fused_step_of(torch::optim::Optimizer& opt);

/// `p`'s state in `opt` (any torch::optim optimizer), or null before its first step: the lookup
/// under the key LibTorch keeps it by (a printed address in 1.x, the address in 2.x).
torch::optim::OptimizerParamState* param_state(torch::optim::Optimizer& opt, const at::Tensor& p);

}  // namespace ampactor::optim
