// JobContext's public face is what a user's step function may call: the pipeline's own calls are
// private (ampactor::pipeline reaches them through internal::PipelineJob).
#include <ampactor/actors/optimizer_actor.h>

#include <torch/optim/optimizer.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "doctest_torch.h"

namespace {

using Tensors = std::vector<at::Tensor>;

// Each detector is true where the call compiles from outside the class (a private member is a
// substitution failure, not an error).
#define AMPACTOR_CALLABLE(name, ...) \
  template <class J, class = void>   \
  struct name : std::false_type {};  \
  template <class J>                 \
  struct name<J, std::void_t<decltype(std::declval<J&>().__VA_ARGS__)>> : std::true_type {}

AMPACTOR_CALLABLE(can_unscale, unscale_(std::declval<torch::optim::Optimizer&>()));
AMPACTOR_CALLABLE(can_clip, clip_grad_norm_(std::declval<torch::optim::Optimizer&>(), 1.0));
AMPACTOR_CALLABLE(can_move,
                  move_and_unscale_(std::declval<torch::optim::Optimizer&>(),
                                    std::declval<const Tensors&>(), std::declval<Tensors&>()));
AMPACTOR_CALLABLE(can_check_fused, check_for_fused_(std::declval<torch::optim::Optimizer&>(),
                                                    std::declval<const Tensors&>(),
                                                    std::declval<Tensors&>(), Tensors{}));
AMPACTOR_CALLABLE(can_record_fused, record_fused_check_(std::declval<torch::optim::Optimizer&>(),
                                                        std::declval<const Tensors&>(), Tensors{},
                                                        at::Tensor(), ampactor::AbsmaxList{}));
AMPACTOR_CALLABLE(can_record_agreed,
                  record_agreed_move_(std::declval<torch::optim::Optimizer&>(), Tensors{}, false,
                                      false, ampactor::GradSize{}, ampactor::AbsmaxList{}));
AMPACTOR_CALLABLE(can_ask_wrote, wrote_weights(std::declval<const torch::optim::Optimizer&>()));
AMPACTOR_CALLABLE(can_write_in_step,
                  write_weights_in_step(std::declval<const torch::optim::Optimizer&>(), Tensors{}));
#undef AMPACTOR_CALLABLE

}  // namespace

TEST_CASE(
    "JobContext: a step function's calls are public, the pipeline's six (move, checks, records, "
    "weights written) are not") {
  using ampactor::JobContext;
  // The detectors see public calls: unscale_ and clip_grad_norm_ are found.
  CHECK(can_unscale<JobContext>::value);
  CHECK(can_clip<JobContext>::value);
  CHECK_FALSE(can_move<JobContext>::value);
  CHECK_FALSE(can_check_fused<JobContext>::value);
  CHECK_FALSE(can_record_fused<JobContext>::value);
  CHECK_FALSE(can_record_agreed<JobContext>::value);
  CHECK_FALSE(can_ask_wrote<JobContext>::value);
  CHECK_FALSE(can_write_in_step<JobContext>::value);
}
