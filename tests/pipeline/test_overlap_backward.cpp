// The overlapped-backward mode (AsyncOptimizerOptions::overlap_backward): each bucket stepped
// speculatively as backward finishes it, committed or dropped at step(). Held to staleness 0
// without overlap, bit for bit: masters, optimizer state and step counts, weights, scales, skips.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "overlap_fixture.h"

using namespace ampactor;
using ampactor::test::opts;
using namespace ampactor::test::overlap;

TEST_CASE("overlap_backward: the same training as staleness 0, bit for bit (Adam, AdamW, SGD)") {
  for (const test::OptConfig& c : test::configs())
    for (at::ScalarType dtype : {at::kHalf, at::kBFloat16})
      same_training(setup(c, dtype));
}

TEST_CASE("overlap_backward: bit for bit with 3 micro-batches, explicit readiness, own buckets") {
  const test::OptConfig adamw = test::configs()[3];
  same_training(setup(adamw, at::kHalf, 3));
  same_training(setup(adamw, at::kHalf, 1, /*hooks=*/false));
  same_training(setup(adamw, at::kBFloat16, 3, false, {{9, 8, 7}, {6, 5, 4, 3}, {2, 1, 0}}));
  same_training(
      setup(test::configs().back(), at::kHalf, 1, true, {{9}, {8, 7, 6, 5, 4, 3, 2, 1, 0}}));
}

TEST_CASE("overlap_backward: its trace replays identically, and holds staleness 0's updates") {
  const Setup s = setup(test::configs()[0], at::kHalf);
  const std::string ov_path = "overlap_backward_trace.jsonl", ref_path = "overlap_ref_trace.jsonl";
  train(s, true, ov_path);
  train(s, false, ref_path);
  const Trace ov = read_trace(ov_path), ref = read_trace(ref_path);
  CHECK(ov.complete);
  const ReplayResult r = replay_trace(ov);
  CHECK(r.identical);
  CHECK(r.matched == ov.events.size());
  // The keeper heard the same unscale reports (found_inf, the gradients' size) and applied the
  // same updates as without overlap.
  auto reports = [](const Trace& t) {
    std::vector<std::string> out;
    for (const TraceEvent& e : t.events) {
      const std::string line = to_json_line(e), type = trace_type_name(e.msg);
      if (type == "UnscaleDone" || type == "UpdateApplied")
        out.push_back(type + line.substr(line.find("\"msg\"")));
    }
    return out;
  };
  CHECK(reports(ov).size() >= 28);
  CHECK(reports(ov) == reports(ref));
  std::remove(ov_path.c_str());
  std::remove(ref_path.c_str());
}

TEST_CASE("overlap_backward: a backward on another thread makes no bucket ready, and is exact") {
  Setup s = setup(test::configs()[0], at::kHalf);
  s.backward_elsewhere = true;
  const Trained ref = train(s, false), ov = train(s, true);
  CHECK_FALSE(ov.speculated);  // the hooks fired off the trainer's thread: step() did it all
  CHECK(ov.scales == ref.scales);
  CHECK(ov.skipped == ref.skipped);
  for (std::size_t i = 0; i < ref.masters.size(); ++i)
    CHECK(test::bits_equal(ov.masters[i], ref.masters[i]));
  for (std::size_t i = 0; i < ref.state.size(); ++i)
    CHECK(test::bits_equal(ov.state[i], ref.state[i]));
}

TEST_CASE("overlap_backward: the second buffers' bytes, the masters' and Adam's state once more") {
  const Setup s = setup(test::configs()[0], at::kHalf);
  const Trained t = train(s, true);
  Model m(at::kHalf);
  std::int64_t params = 0;
  for (const at::Tensor& p : m.p)
    params += p.numel();
  CHECK(t.extra_bytes == params * (12 + 2));  // masters, exp_avg, exp_avg_sq; fp16 weights
}

TEST_CASE("overlap_backward: a gradient final twice is refused, and nothing is committed") {
  Model m(at::kHalf);
  GradScaler scaler(opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
  AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).overlap_backward(true));
  auto& opt = pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-2));
  const std::vector<at::Tensor> before = test::clones(pipe.optim_parameters());
  scaler.scale(m.loss(0, 0, false)).backward();
  try {
    scaler.scale(m.loss(1, 0, false)).backward();  // no accumulate(true)
    FAIL("a second backward without accumulate(true) was accepted");
  } catch (const ScalerError& e) {
    CHECK(std::string(e.what()).find("accumulated again") != std::string::npos);
  }
  CHECK_THROWS_AS(pipe.step(opt, [&] { scaler.step(opt); }), ScalerError);
  scaler.run_on_optimizer([&] { CHECK_FALSE(opt.speculation_pending()); });
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(test::bits_equal(pipe.optim_parameters()[i], before[i]));
  CHECK(opt.state().empty());
  // grads_ready twice in one iteration: refused the same way.
  m.zero_grad();
  AsyncOptimizer manual(
      m.p, scaler,
      AsyncOptimizerOptions().staleness(0).overlap_backward(true).ready_by_hooks(false));
  pipe.accumulate(true);  // the first pipeline's hooks stay quiet from here
  scaler.scale(m.loss(2, 0, false)).backward();
  manual.grads_ready(0);
  CHECK_THROWS_AS(manual.grads_ready(0), ScalerError);
  CHECK_THROWS_AS(manual.grads_ready(manual.buckets().size()), ScalerError);
}

TEST_CASE("overlap_backward: options it cannot run with are refused, naming why") {
  Model m(at::kHalf);
  GradScaler scaler(opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
  auto refused = [&](const AsyncOptimizerOptions& o, const char* why) {
    try {
      AsyncOptimizer pipe(m.p, scaler, o);
      FAIL("accepted");
    } catch (const ScalerError& e) {
      CHECK(e.code() == errc::bad_option);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  const auto ov = AsyncOptimizerOptions().staleness(0).overlap_backward(true);
  refused(AsyncOptimizerOptions().staleness(1).overlap_backward(true), "staleness 0");
  refused(AsyncOptimizerOptions(ov).buckets({{0, 1}, {1}}), "in two buckets");
  refused(AsyncOptimizerOptions(ov).buckets({{0, 1}}), "in no bucket");
  refused(AsyncOptimizerOptions(ov).buckets({{0}, {}}), "is empty");
  CHECK_THROWS_AS(AsyncOptimizerOptions().bucket_bytes(0), ScalerError);
  AsyncOptimizer pipe(m.p, scaler, ov);
  torch::optim::Adam own(pipe.optim_parameters(), torch::optim::AdamOptions(1e-2));
  scaler.scale(m.loss(0, 0, false)).backward();
  try {
    pipe.step(own, [&] { scaler.step(own); });
    FAIL("LibTorch's Adam was accepted");
  } catch (const ScalerError& e) {
    CHECK(std::string(e.what()).find("FusedAdam, FusedAdamW or FusedSGD") != std::string::npos);
  }
  // A fused optimizer over the masters in another order: its steps would pair them with the
  // wrong gradients.
  AsyncOptimizer pipe2(m.p, scaler, ov);
  std::vector<at::Tensor> reversed(pipe2.optim_parameters().rbegin(),
                                   pipe2.optim_parameters().rend());
  optim::FusedSGD shuffled(reversed, torch::optim::SGDOptions(0.1));
  try {
    pipe2.step(shuffled, [&] { scaler.step(shuffled); });
    FAIL("an optimizer over the masters in another order was accepted");
  } catch (const ScalerError& e) {
    CHECK(std::string(e.what()).find("in the order of optim_parameters()") != std::string::npos);
  }
  AsyncOptimizer plain(m.p, scaler, AsyncOptimizerOptions().staleness(0));
  CHECK_THROWS_AS(plain.grads_ready(0), ScalerError);
  CHECK(plain.overlap_bytes() == 0);
}

namespace {
/// Five steps of FusedAdamW with the scaler disabled; returns the model's weights.
std::vector<at::Tensor> disabled_run(const GradScalerOptions& so, const AsyncOptimizerOptions& o) {
  Model m(at::kFloat);
  GradScaler scaler(GradScalerOptions(so).enabled(false));
  AsyncOptimizer pipe(m.p, scaler, o);
  auto& opt = pipe.make_optimizer<optim::FusedAdamW>(torch::optim::AdamWOptions(1e-2));
  for (int k = 0; k < 5; ++k) {
    m.zero_grad();
    scaler.scale(m.loss(k, 0, false)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  return test::clones(m.p);
}
}  // namespace

TEST_CASE("overlap_backward: with the scaler disabled it steps as staleness 0 does, bit for bit") {
  const auto o = AsyncOptimizerOptions().staleness(0);
  const auto ref = disabled_run({}, o);
  const auto ov = disabled_run({}, AsyncOptimizerOptions(o).overlap_backward(true));
  for (std::size_t i = 0; i < ref.size(); ++i)
    CHECK(test::bits_equal(ov[i], ref[i]));
}

TEST_CASE(
    "overlap_backward: clipped as staleness 0 clips, bit for bit, over clipped and unclipped "
    "steps") {
  for (const test::OptConfig& c : {test::configs()[0], test::configs()[7]})
    for (int micro : {1, 3}) {
      const Setup s = clip_at_median(setup(c, at::kHalf, micro));
      same_training(s);
      const Trained ref = train(s, false), ov = train(s, true);
      int clipped = 0, unclipped = 0;
      for (std::size_t k = 0; k < ref.norms.size(); ++k) {
        CAPTURE(k);
        CHECK(std::isnan(ref.norms[k]) == bool(ref.skipped[k]));
        if (ref.skipped[k]) continue;
        CHECK(ov.norms[k] == ref.norms[k]);
        (ref.norms[k] > s.clip ? clipped : unclipped)++;
      }
      CHECK(clipped >= 2);
      CHECK(unclipped >= 2);
    }
}

TEST_CASE(
    "overlap_backward with shard_optimizer_state (one rank): bit for bit the rank path at "
    "staleness 0, its speculation taken, clipped and not, the spare weights counted") {
  // The sharded pipeline's buckets: the mean into the shard's holders, the pieces stepped into
  // its flat spare, all-gathered and swapped in at step(). 2 and 4 ranks: the distributed suite.
  for (const test::OptConfig& c : {test::configs()[3], test::configs().back()})
    for (int micro : {1, 3}) {
      Setup s = setup(c, at::kHalf, micro);
      s.ranked = s.shard = true;
      same_training(s);
      same_training(clip_at_median(s));
    }
  Setup s = setup(test::configs()[0], at::kBFloat16);
  s.ranked = s.shard = true;
  std::int64_t params = 0;
  for (const at::Tensor& p : Model(at::kHalf).p)
    params += p.numel();
  CHECK(train(s, true).extra_bytes == params * (12 + 2));  // masters and moments; the flat spare
}

TEST_CASE("overlap_backward with shard_optimizer_state: the scaler disabled steps as staleness 0") {
  const auto so = GradScalerOptions().ranks(std::make_shared<test::SoloRanks>());
  const auto o = AsyncOptimizerOptions().staleness(0);
  const auto ref = disabled_run(so, o);
  const auto sharded =
      disabled_run(so, AsyncOptimizerOptions(o).overlap_backward(true).shard_optimizer_state(true));
  for (std::size_t i = 0; i < ref.size(); ++i)
    CHECK(test::bits_equal(sharded[i], ref[i]));
}

TEST_CASE(
    "overlap_backward with ranks: the scaler disabled averages the gradients as staleness 0") {
  // Nothing was speculated (nor averaged by bucket): the step is staleness 0's, its average too.
  const auto plain = std::make_shared<test::SoloRanks>(),
             overlapped = std::make_shared<test::SoloRanks>();
  const auto o = AsyncOptimizerOptions().staleness(0);
  const auto ref = disabled_run(GradScalerOptions().ranks(plain), o);
  const auto ov = disabled_run(GradScalerOptions().ranks(overlapped),
                               AsyncOptimizerOptions(o).overlap_backward(true));
  CHECK(plain->averages == 5);
  CHECK(overlapped->averages == plain->averages);
  for (std::size_t i = 0; i < ref.size(); ++i)
    CHECK(test::bits_equal(ov[i], ref[i]));
}
