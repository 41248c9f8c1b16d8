// The pipeline's plan (pipeline/internal/plan.h): each combination of options maps to one place
// for the masters and one wait, or to the one refusal, before anything is built.
#include "doctest_torch.h"
#include "solo_ranks.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include "pipeline/internal/plan.h"

#include <ATen/ops/ones.h>

#include <memory>
#include <string>
#include <vector>

using namespace ampactor;
using internal::PipelinePlan;

namespace {

/// plan_pipeline's refusal of `o` (empty: none), checking its code.
std::string refusal(const AsyncOptimizerOptions& o, const GradScaler& scaler,
                    const std::vector<at::Tensor>& model, errc code = errc::bad_option) {
  try {
    internal::plan_pipeline(o, scaler, model);
  } catch (const ScalerError& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE(
    "the pipeline's plan: each combination's place for the masters and wait, sharding stacked") {
  GradScaler alone;
  GradScaler ranked(GradScalerOptions().ranks(std::make_shared<test::SoloRanks>()));
  const std::vector<at::Tensor> model = {at::ones({4}).set_requires_grad(true)};
  struct Case {
    AsyncOptimizerOptions o;
    bool ranks;
    const char* text;
  };
  const std::vector<Case> cases = {
      {AsyncOptimizerOptions().staleness(0), false, "model_device, synchronous"},
      {AsyncOptimizerOptions(), false, "model_device, stale"},
      {AsyncOptimizerOptions().swap_weights(true), false, "model_device, stale (swap)"},
      {AsyncOptimizerOptions().swap_weights(true).defer_grad_move(true), false,
       "model_device, stale (swap, defer)"},
      {AsyncOptimizerOptions().staleness(0).overlap_backward(true), false,
       "model_device, overlapped"},
      {AsyncOptimizerOptions().staleness(0).master_device(at::kCPU), false,
       "model_device, synchronous"},  // the model is on the CPU: nothing to offload
      {AsyncOptimizerOptions().shard_optimizer_state(true), true, "model_device, sharded, stale"},
      {AsyncOptimizerOptions().staleness(0).overlap_backward(true).shard_optimizer_state(true),
       true, "model_device, sharded, overlapped"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const PipelinePlan plan = internal::plan_pipeline(c.o, c.ranks ? ranked : alone, model);
    CHECK(plan.text() == c.text);
    CHECK((plan.master_device == at::Device(at::kCPU)));
  }
}

TEST_CASE("the pipeline's plan: every refused combination in one place, the first one named") {
  GradScaler alone;
  const std::vector<at::Tensor> model = {at::ones({4}).set_requires_grad(true)};
  CHECK(refusal(AsyncOptimizerOptions().staleness(0).swap_weights(true), alone, model) ==
        "AsyncOptimizer: swap_weights needs staleness 1");
  CHECK(refusal(AsyncOptimizerOptions().staleness(0).defer_grad_move(true), alone, model) ==
        "AsyncOptimizer: defer_grad_move needs staleness 1");
  CHECK(refusal(AsyncOptimizerOptions().overlap_backward(true), alone, model) ==
        "AsyncOptimizer: overlap_backward needs staleness 0 (it is exact; staleness 1 steps a "
        "whole iteration late)");
  // Both wrong: the staleness is named first, as a user meets it.
  CHECK(refusal(AsyncOptimizerOptions().staleness(0).swap_weights(true).shard_optimizer_state(true),
                alone, model) == "AsyncOptimizer: swap_weights needs staleness 1");
  CHECK(refusal(AsyncOptimizerOptions().shard_optimizer_state(true), alone, model) ==
        "AsyncOptimizer: shard_optimizer_state needs data-parallel ranks "
        "(GradScalerOptions::ranks)");
  CHECK(refusal(AsyncOptimizerOptions(), alone, {at::ones({2}, at::kLong)}, errc::bad_parameters) ==
        "AsyncOptimizer: model parameter 0 is not a floating-point tensor");
  CHECK(refusal(AsyncOptimizerOptions(), alone, {at::Tensor()}, errc::bad_parameters) ==
        "AsyncOptimizer: model parameter 0 is not a floating-point tensor");
  CHECK(refusal(AsyncOptimizerOptions().staleness(0), alone, model).empty());
}
