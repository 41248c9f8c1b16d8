// AsyncOptimizerOptions as named options: defaults, chainable setters, refusals that change
// nothing, and the combinations AsyncOptimizer's constructor refuses.
#include "doctest_torch.h"
#include "solo_ranks.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/ranks.h>

#include <ATen/ops/ones.h>

#include <cmath>
#include <functional>
#include <string>

using namespace ampactor;

namespace {

bool same(const AsyncOptimizerOptions& a, const AsyncOptimizerOptions& b) {
  return a.staleness() == b.staleness() && a.optim_dtype() == b.optim_dtype() &&
         a.optimizer_threads() == b.optimizer_threads() && a.swap_weights() == b.swap_weights() &&
         a.defer_grad_move() == b.defer_grad_move() && a.clip_grad_norm() == b.clip_grad_norm();
}

AsyncOptimizerOptions custom() {
  return AsyncOptimizerOptions()
      .staleness(0)
      .optim_dtype(at::kDouble)
      .optimizer_threads(3)
      .swap_weights(true)
      .defer_grad_move(true)
      .clip_grad_norm(2.0);
}

/// What `set` throws (empty when it does not), checking that the options are unchanged.
std::string refused(const std::function<void(AsyncOptimizerOptions&)>& set) {
  AsyncOptimizerOptions o = custom();
  try {
    set(o);
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_option);
    CHECK(same(o, custom()));
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("AsyncOptimizerOptions: defaults") {
  const AsyncOptimizerOptions o;
  CHECK(o.staleness() == 1);
  CHECK((o.optim_dtype() == at::kFloat));
  CHECK(o.optimizer_threads() == 0);
  CHECK_FALSE(o.swap_weights());
  CHECK_FALSE(o.defer_grad_move());
  CHECK_FALSE(o.clip_grad_norm());
}

TEST_CASE("AsyncOptimizerOptions: each setter stores its value and returns the options") {
  AsyncOptimizerOptions o;
  CHECK(&o.staleness(0) == &o);
  CHECK(&o.optim_dtype(at::kDouble) == &o);
  CHECK(&o.optimizer_threads(3) == &o);
  CHECK(&o.swap_weights(true) == &o);
  CHECK(&o.defer_grad_move(true) == &o);
  CHECK(&o.clip_grad_norm(2.0) == &o);
  CHECK(o.staleness() == 0);
  CHECK((o.optim_dtype() == at::kDouble));
  CHECK(o.optimizer_threads() == 3);
  CHECK(o.swap_weights());
  CHECK(o.defer_grad_move());
  CHECK(o.clip_grad_norm() == 2.0);
  CHECK(same(o, custom()));
  CHECK_FALSE(AsyncOptimizerOptions(o).clip_grad_norm(std::nullopt).clip_grad_norm());
}

TEST_CASE("AsyncOptimizerOptions: a refused value throws bad_option and changes nothing") {
  using O = AsyncOptimizerOptions;
  CHECK(refused([](O& o) { o.staleness(2); }) == "AsyncOptimizer: staleness must be 0 or 1, got 2");
  CHECK(refused([](O& o) { o.staleness(-1); }) ==
        "AsyncOptimizer: staleness must be 0 or 1, got -1");
  for (at::ScalarType t : {at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kBool}) {
    CAPTURE(t);
    CHECK(refused([t](O& o) { o.optim_dtype(t); }) ==
          "AsyncOptimizer: optim_dtype must be float or double");
  }
  CHECK(refused([](O& o) { o.optimizer_threads(-1); }) ==
        "AsyncOptimizer: optimizer_threads must be >= 0, got -1");
  CHECK(refused([](O& o) { o.clip_grad_norm(0.0); }) ==
        "AsyncOptimizer: clip_grad_norm must be finite and > 0, got 0");
  CHECK(refused([](O& o) { o.clip_grad_norm(-1.0); }) ==
        "AsyncOptimizer: clip_grad_norm must be finite and > 0, got -1");
  CHECK(refused([](O& o) { o.clip_grad_norm(INFINITY); }) ==
        "AsyncOptimizer: clip_grad_norm must be finite and > 0, got inf");
  CHECK(refused([](O& o) { o.clip_grad_norm(NAN); }) ==
        "AsyncOptimizer: clip_grad_norm must be finite and > 0, got nan");
  CHECK(refused([](O& o) { o.staleness(1).optim_dtype(at::kFloat).optimizer_threads(0); }) == "");
}

TEST_CASE("AsyncOptimizer refuses swap_weights or defer_grad_move with staleness 0") {
  GradScaler scaler(GradScalerOptions().init_scale(256));
  const std::vector<at::Tensor> params = {at::ones({4}).set_requires_grad(true)};
  for (bool defer : {false, true}) {
    CAPTURE(defer);
    const auto o = AsyncOptimizerOptions().staleness(0).swap_weights(!defer).defer_grad_move(defer);
    std::string what;
    try {
      AsyncOptimizer pipe(params, scaler, o);
    } catch (const ScalerError& e) {
      CHECK(e.code() == errc::bad_option);
      what = e.what();
    }
    CHECK(what == (defer ? "AsyncOptimizer: defer_grad_move needs staleness 1"
                         : "AsyncOptimizer: swap_weights needs staleness 1"));
  }
  AsyncOptimizer ok(params, scaler, AsyncOptimizerOptions().staleness(0));
  CHECK(ok.staleness() == 0);
}

using ampactor::test::SoloRanks;

TEST_CASE("shard_optimizer_state: refused without ranks, taken with swap_weights and overlap") {
  const std::vector<at::Tensor> params = {at::ones({4}).set_requires_grad(true)};
  auto refusal = [&](GradScaler& scaler, const AsyncOptimizerOptions& o) {
    try {
      AsyncOptimizer pipe(params, scaler, o);
    } catch (const ScalerError& e) {
      CHECK(e.code() == errc::bad_option);
      return std::string(e.what());
    }
    return std::string();
  };
  GradScaler alone;
  CHECK(refusal(alone, AsyncOptimizerOptions().shard_optimizer_state(true)) ==
        "AsyncOptimizer: shard_optimizer_state needs data-parallel ranks "
        "(GradScalerOptions::ranks)");
  GradScaler ranked(GradScalerOptions().ranks(std::make_shared<SoloRanks>()));
  const auto sharded = AsyncOptimizerOptions().shard_optimizer_state(true);
  CHECK(refusal(ranked, AsyncOptimizerOptions(sharded).swap_weights(true)).empty());  // works
  CHECK(
      refusal(ranked, AsyncOptimizerOptions(sharded).staleness(0).overlap_backward(true)).empty());
  AsyncOptimizer one(params, ranked, sharded);  // one rank: the whole model is its shard
  REQUIRE(one.optim_parameters().size() == 1);
  CHECK(one.optim_parameters()[0].sizes() == at::IntArrayRef{4});
}
