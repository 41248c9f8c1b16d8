// The pipeline's calls on a step job (ampactor::pipeline reaches them here; JobContext keeps them
// private, so its public face is what a user's step function may call). Not installed.
#pragma once

#include <ampactor/actors/optimizer_actor.h>

#include <utility>
#include <vector>

namespace ampactor::internal {

/// JobContext's pipeline-only calls, documented there: PipelineJob(*JobContext::current()).
class PipelineJob {
 public:
  explicit PipelineJob(JobContext& job) : job_(job) {}

  bool move_and_unscale_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                         std::vector<at::Tensor>& masters, bool adopt = false,
                         const GradReduce& reduce = {}) {
    return job_.move_and_unscale_(opt, model_grads, masters, adopt, reduce);
  }
  bool check_for_fused_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                        std::vector<at::Tensor>& masters, std::vector<at::Tensor> weights) {
    return job_.check_for_fused_(opt, model_grads, masters, std::move(weights));
  }
  bool record_fused_check_(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& model_grads,
                           std::vector<at::Tensor> weights, at::Tensor found, AbsmaxList absmax) {
    return job_.record_fused_check_(opt, model_grads, std::move(weights), std::move(found),
                                    std::move(absmax));
  }
  bool record_agreed_move_(torch::optim::Optimizer& opt, std::vector<at::Tensor> weights,
                           bool local_found, bool found, GradSize size, AbsmaxList absmax,
                           std::vector<std::int32_t> found_by = {}) {
    return job_.record_agreed_move_(opt, std::move(weights), local_found, found, size,
                                    std::move(absmax), std::move(found_by));
  }
  bool wrote_weights(const torch::optim::Optimizer& opt) const { return job_.wrote_weights(opt); }
  void write_weights_in_step(const torch::optim::Optimizer& opt, std::vector<at::Tensor> weights) {
    job_.write_weights_in_step(opt, std::move(weights));
  }

 private:
  JobContext& job_;
};

}  // namespace ampactor::internal
