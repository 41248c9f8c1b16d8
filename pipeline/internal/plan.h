// The pipeline's plan, chosen once at construction from its options, its scaler and its model:
// where the masters live (sharding stacks on either place) and what the trainer waits for at
// step(). Every refusal of a combination of options is made here, before anything is built.
#pragma once

#include <ampactor/pipeline/async_optimizer.h>

#include <string>
#include <vector>

namespace ampactor::internal {

struct PipelinePlan {
  /// Where the gradients go and the new weights come from.
  enum class Masters { model_device, host_offload };
  /// What step() waits for: the step itself, the last one (staleness 1), or the buckets
  /// stepped during backward.
  enum class Wait { synchronous, stale, overlapped };

  Masters masters = Masters::model_device;
  bool sharded = false;
  Wait wait = Wait::synchronous;
  bool swap = false;   // stale: the spare weights (swap_weights)
  bool defer = false;  // stale: the grads moved in the step's job (defer_grad_move)
  at::Device master_device{at::kCPU};

  /// "host_offload, sharded, stale (swap, defer)".
  std::string text() const;
};

/// The plan for `o` over this scaler and model, or the one refusal: ScalerError(errc::bad_option)
/// for a combination, errc::bad_parameters for a parameter that is no floating-point tensor.
PipelinePlan plan_pipeline(const AsyncOptimizerOptions& o, const GradScaler& scaler,
                           const std::vector<at::Tensor>& model);

}  // namespace ampactor::internal
