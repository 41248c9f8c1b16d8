// StepTracker's pipeline records: the weights a fused step writes after a grad move
// (write_weights_in_step), refused at any other stage.
#include "doctest_torch.h"

#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <vector>

using namespace ampactor;

namespace {
/// Two masters of one fused Adam, their model gradients (scaled by 4) and 16-bit weights.
struct Moved {
  std::vector<at::Tensor> masters = {at::ones({3}).set_requires_grad(true),
                                     at::full({2}, 2.0f).set_requires_grad(true)};
  optim::FusedAdam opt{masters, torch::optim::AdamOptions(0.1)};
  std::vector<at::Tensor> grads = {at::full({3}, 4.0f, at::kHalf), at::full({2}, -8.0f, at::kHalf)};
  std::vector<at::Tensor> weights = {at::zeros({3}, at::kHalf), at::zeros({2}, at::kHalf)};
};
}  // namespace

TEST_CASE("write_weights_in_step: after the move the fused step writes the weights it was given") {
  Moved m;
  StepTracker t(true);
  REQUIRE_FALSE(t.move_and_unscale_(m.opt, m.grads, m.masters, 0.25f));
  t.write_weights_in_step(m.opt, m.weights);
  CHECK_FALSE(t.wrote_weights(m.opt));
  t.step(m.opt, 0.25f);
  CHECK(t.wrote_weights(m.opt));
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    CHECK_FALSE(m.masters[i].detach().equal(i == 0 ? at::ones({3}) : at::full({2}, 2.0f)));
    CHECK(m.weights[i].equal(m.masters[i].detach().to(at::kHalf)));  // the stepped masters
  }
}

TEST_CASE("write_weights_in_step: refused before the move and after the step, changing nothing") {
  Moved m;
  StepTracker t(true);
  CHECK_THROWS_WITH_AS(t.write_weights_in_step(m.opt, m.weights),
                       doctest::Contains("were not moved in this iteration"), ScalerError);
  t.move_and_unscale_(m.opt, m.grads, m.masters, 0.25f);
  t.step(m.opt, 0.25f);
  CHECK_FALSE(t.wrote_weights(m.opt));  // none were given
  CHECK_THROWS_AS(t.write_weights_in_step(m.opt, m.weights), ScalerError);
  CHECK_FALSE(t.wrote_weights(m.opt));
  for (const at::Tensor& w : m.weights)
    CHECK(w.equal(at::zeros_like(w)));
}

TEST_CASE("write_weights_in_step: a skipped step writes nothing and says so") {
  Moved m;
  m.grads[1][0] = INFINITY;
  StepTracker t(true);
  REQUIRE(t.move_and_unscale_(m.opt, m.grads, m.masters, 0.25f));
  t.write_weights_in_step(m.opt, m.weights);
  CHECK(t.step(m.opt, 0.25f).skipped);
  CHECK_FALSE(t.wrote_weights(m.opt));
  for (const at::Tensor& w : m.weights)
    CHECK(w.equal(at::zeros_like(w)));
}
