// The overlapped-backward mode's training fixture: an MLP of 16-bit weights trained 14 iterations
// with planted overflows, with and without overlap_backward, on the CPU or with the model on the
// GPU and the masters on the CPU; and the bit-for-bit comparison of two such runs.
#pragma once

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/trace.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fused_fixture.h"
#include "scale_options.h"
#include "solo_ranks.h"

namespace ampactor::test::overlap {

using ampactor::test::opts;

/// An MLP of 16-bit weights whose math runs in fp32 (the gradients come back in the weights'
/// dtype): layers of W (rows x rows) and b, and a head. Parameters in forward order.
struct Model {
  std::vector<at::Tensor> p;
  explicit Model(at::ScalarType dtype, at::Device device = at::kCPU, int layers = 4,
                 std::int64_t width = 24) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    for (int l = 0; l <= layers; ++l) {
      const std::int64_t out = l == layers ? 1 : width;
      p.push_back((at::randn({width, out}, gen) / 5).to(device, dtype).set_requires_grad(true));
      p.push_back((at::randn({out}, gen) / 10).to(device, dtype).set_requires_grad(true));
    }
  }
  /// The loss of batch k; `spike` adds a term whose gradient overflows the first layer's W only
  /// (the last bucket backward finishes); `skip_head_bias` leaves a parameter without a grad.
  at::Tensor loss(int k, float spike, bool skip_head_bias) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + k);
    at::Tensor h = at::randn({8, p[0].size(0)}, gen).to(p[0].device());
    const std::size_t layers = p.size() / 2;
    for (std::size_t l = 0; l < layers; ++l) {
      h = at::matmul(h, p[2 * l].to(at::kFloat));
      if (!(skip_head_bias && l + 1 == layers)) h = h + p[2 * l + 1].to(at::kFloat);
      if (l + 1 < layers) h = at::tanh(h);
    }
    at::Tensor l = (h * h).mean();
    if (spike != 0) l = l + spike * p[0].to(at::kFloat).sum();
    return l;
  }
  void zero_grad() {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
  }
};

struct Setup {
  test::OptConfig config;
  at::ScalarType dtype = at::kHalf;
  int micro = 1;
  bool hooks = true;
  std::vector<std::vector<std::size_t>> buckets;  // empty: by bucket_bytes
  bool backward_elsewhere = false;                // backward on a thread of its own
  double clip = 0;                                // clip_grad_norm's max_norm (0: none)
  bool gpu = false;     // the model on the GPU, the masters on the CPU (master_device)
  bool ranked = false;  // one data-parallel rank (SoloRanks): the pipeline's rank paths
  bool shard = false;   // ranked: the overlapped run shards its state (one rank: one shard)
};

inline Setup setup(const test::OptConfig& c, at::ScalarType dtype, int micro = 1, bool hooks = true,
                   std::vector<std::vector<std::size_t>> buckets = {}) {
  return Setup{c, dtype, micro, hooks, std::move(buckets), false};
}

struct Trained {
  std::vector<at::Tensor> masters, weights, state;
  std::vector<double> scales;
  std::vector<bool> skipped;
  std::vector<double> norms;  // clip: grad_norm() after each step
  std::int64_t extra_bytes = 0;
  bool speculated = false;  // a bucket's step was pending before step() in some iteration
  int swapped = 0;          // masters that step() took from the second buffer (a swap)
};

inline std::unique_ptr<torch::optim::Optimizer> fused_over(const test::OptConfig& c,
                                                           const std::vector<at::Tensor>& ps) {
  return test::make_optimizer(c, ps, /*fused=*/true);
}

/// 14 iterations: overflows in the whole gradient (3, 4) and in the last bucket alone (8), an
/// iteration without the head's bias (10), the scale grown every 2 clean updates.
inline Trained train(const Setup& s, bool overlap, const std::string& trace = "") {
  Model m(s.dtype, s.gpu ? at::Device(at::kCUDA) : at::Device(at::kCPU));
  KeeperOptions keeper;
  if (!trace.empty()) keeper.tap(record_trace(trace));
  GradScalerOptions so = opts(1024, 2, 0.5, 2).allow_fp16_grads(true);
  if (s.ranked) so.ranks(std::make_shared<SoloRanks>());
  GradScaler scaler(so, keeper);
  auto o = AsyncOptimizerOptions().staleness(0);
  if (s.clip > 0) o.clip_grad_norm(s.clip);
  if (s.gpu) o.master_device(at::Device(at::kCPU));
  if (overlap)
    o.overlap_backward(true)
        .bucket_bytes(24 * 24 * 4)
        .buckets(s.buckets)
        .ready_by_hooks(s.hooks)
        .shard_optimizer_state(s.shard);
  AsyncOptimizer pipe(m.p, scaler, o);
  auto opt = fused_over(s.config, pipe.optim_parameters());
  auto* fused = optim::fused_step_of(*opt);
  Trained t;
  for (int k = 0; k < 14; ++k) {
    m.zero_grad();
    const float spike = k == 8 ? 1e36f : 0.0f;  // inf in fp32 once scaled
    const double blow = k == 3 || k == 4 ? 1e38 : 1.0;
    for (int j = 0; j < s.micro; ++j) {
      const bool last = j + 1 == s.micro;
      if (overlap && s.micro > 1) pipe.accumulate(!last);
      const at::Tensor l = scaler.scale(m.loss(k * 7 + j, spike, k == 10) * blow);
      if (s.backward_elsewhere)
        std::thread([&] { l.backward(); }).join();
      else
        l.backward();
    }
    if (overlap && !s.hooks)
      for (std::size_t b = 0; b < pipe.buckets().size(); ++b)
        pipe.grads_ready(b);
    if (overlap) {  // the bucket jobs have run once the optimizer is idle
      bool pending = false;
      scaler.run_on_optimizer([&] { pending = fused->speculation_pending(); });
      t.speculated = t.speculated || pending;
    }
    t.scales.push_back(scaler.get_scale());
    std::vector<void*> where;
    for (const at::Tensor& x : pipe.optim_parameters())
      where.push_back(x.data_ptr());
    pipe.step(*opt, [&] { scaler.step(*opt); });
    for (std::size_t i = 0; i < where.size(); ++i)
      t.swapped += pipe.optim_parameters()[i].data_ptr() != where[i];
    t.norms.push_back(pipe.grad_norm());
    scaler.update();
  }
  pipe.sync();
  for (int k = 0; k < 14; ++k)
    t.skipped.push_back(scaler.wait_result(k).skipped());
  t.scales.push_back(scaler.get_scale());
  // Flat: a sharded pipeline's masters are 1-D pieces (one per parameter on one rank).
  REQUIRE(pipe.optim_parameters().size() == m.p.size());
  for (std::size_t i = 0; i < m.p.size(); ++i) {
    t.masters.push_back(pipe.optim_parameters()[i].detach().reshape({-1}).clone());
    t.weights.push_back(m.p[i].detach().cpu().clone());
    for (const at::Tensor& x : test::state_of(*opt, pipe.optim_parameters()[i]))
      t.state.push_back(x.reshape({-1}).clone());
  }
  t.extra_bytes = pipe.overlap_bytes();
  return t;
}

/// s with clip_grad_norm's max_norm at the median of the norms a run that never clips measures:
/// steps on both sides of it.
inline Setup clip_at_median(Setup s) {
  s.clip = 1e30;
  std::vector<double> norms;
  for (double n : train(s, false).norms)
    if (!std::isnan(n)) norms.push_back(n);
  std::sort(norms.begin(), norms.end());
  s.clip = norms[norms.size() / 2];
  return s;
}

inline void same_training(const Setup& s) {
  CAPTURE(s.config.name());
  CAPTURE(c10::toString(s.dtype));
  CAPTURE(s.micro);
  CAPTURE(s.hooks);
  CAPTURE(s.buckets.size());
  const Trained ref = train(s, false), ov = train(s, true);
  CHECK(ov.speculated);
  CHECK(ov.swapped > 0);  // speculative steps were taken, not stepped again
  CHECK(ref.swapped == 0);
  CHECK(ov.scales == ref.scales);
  CHECK(ov.skipped == ref.skipped);
  CHECK(ref.skipped[3]);
  CHECK(ref.skipped[8]);
  CHECK_FALSE(ref.skipped[10]);
  REQUIRE(ov.state.size() == ref.state.size());
  for (std::size_t i = 0; i < ref.masters.size(); ++i) {
    CAPTURE(i);
    CHECK(test::bits_equal(ov.masters[i], ref.masters[i]));
    CHECK(test::bits_equal(ov.weights[i], ref.weights[i]));
  }
  for (std::size_t i = 0; i < ref.state.size(); ++i)
    CHECK(test::bits_equal(ov.state[i], ref.state[i]));
}

}  // namespace ampactor::test::overlap
