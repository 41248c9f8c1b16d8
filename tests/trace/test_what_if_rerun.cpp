// What-if predictions against real re-runs on the demo's model (fp16 character-level LM): each
// iteration's gradients are made at a recorded scale and measured by the kernels (found_inf and
// the largest finite |gradient|, as the optimizer reports them), then made again from the same
// weights and batch at other scales. Wherever what-if decides (same, bound, predicted), its
// found_inf must be the re-run's; where it says "unknown", nothing is claimed.
#include "doctest_torch.h"

#include <ampactor/kernels/unscale.h>
#include <ampactor/trace/replay.h>

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "../../demo/charlm.h"

using namespace ampactor;

namespace {

struct Measured {
  bool found_inf = false;
  double grad_max = 0;
};

/// Backward of the model's loss at `scale` from its current weights; the kernels' measure of the
/// fp16 gradients, read-only (as the optimizer's check sees them).
Measured grads_at(demo::CharMlp& model, const at::Tensor& x, const at::Tensor& y, float scale) {
  model.zero_grad();
  (model.loss(x, y) * scale).backward();
  std::vector<at::Tensor> grads;
  for (auto& p : model.parameters())
    grads.push_back(p.grad());
  at::Tensor found = at::zeros({}), absmax = at::zeros({});
  kernels::check_finite(grads, found, absmax);
  return {found.item<float>() != 0, absmax.item<float>()};
}

}  // namespace

TEST_CASE("what-if found_inf equals a real re-run at the other scale on the demo's model") {
  const std::string text = "/usr/share/common-licenses";
  if (!std::filesystem::is_directory(text))
    AMPACTOR_SKIP("no " + text + " (the demo's corpus is missing)");
  const demo::Corpus corpus(text);
  demo::ModelShape shape;
  shape.vocab = corpus.vocab();
  shape.hidden = 64;
  demo::CharMlp model(shape, at::kHalf, 5);
  std::mt19937_64 rng(11);
  std::mt19937 pick(3);
  std::int64_t decided = 0, predicted = 0, predicted_overflow = 0, unknown = 0, wrong = 0;
  for (int it = 0; it < 24; ++it) {
    auto [x, y] = corpus.batch(rng, 256, shape.context, false);
    // Recorded scales from 2^8 to 2^22: gradients from far below fp16's range to over it.
    const float s = std::ldexp(1.0f, 8 + int(pick() % 15));
    const Measured rec = grads_at(model, x, y, s);
    UnscaleDone d;
    d.found_inf = rec.found_inf;
    d.scale_used = s;
    d.grad_max = rec.grad_max;
    d.dtype_max = 65504;
    for (int e = -6; e <= 6; ++e) {
      const float t = std::ldexp(s, e);
      const auto [found, basis] = found_inf_at(d, t);
      if (basis == WhatIfBasis::unknown) {
        ++unknown;
        continue;
      }
      const Measured real = grads_at(model, x, y, t);
      CAPTURE(it);
      CAPTURE(s);
      CAPTURE(t);
      CAPTURE(rec.grad_max);
      CHECK(found == real.found_inf);
      wrong += found != real.found_inf;
      ++decided;
      if (basis == WhatIfBasis::predicted) {
        ++predicted;
        predicted_overflow += found;
      }
    }
    // Move the weights a little so the iterations differ (plain SGD on the unscaled fp32 grads).
    const Measured clean = grads_at(model, x, y, 1.0f);
    if (!clean.found_inf) {
      at::AutoGradMode no_grad(false);
      for (auto& p : model.parameters())
        p.sub_(p.grad().to(at::kFloat).mul(0.5).to(p.scalar_type()));
    }
  }
  MESSAGE("decided " << decided << " (predicted from the size: " << predicted << ", of which "
                     << predicted_overflow << " overflow), unknown " << unknown << ", wrong "
                     << wrong);
  CHECK(predicted > 20);
  CHECK(predicted_overflow > 0);
  CHECK(predicted_overflow < predicted);
}
