// RoundPipe's setting: an fp16 model on the GPU, fp32 masters and the optimizer on the CPU
// (AsyncOptimizerOptions::master_device = CPU). Every case needs a CUDA device and a LibTorch
// with CUDA; without them each prints "skipped: ..." and passes.
#include "doctest_torch.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/tanh.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <stdexcept>

#include "scale_options.h"
#include "solo_ranks.h"
#include "tensor_helpers.h"
#include "torch_cuda_skip.h"

using namespace ampactor;
using ampactor::test::opts;

namespace {

const at::Device gpu("cuda");

at::Tensor seeded(std::vector<std::int64_t> shape, std::uint64_t seed, float sd = 0.5f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, sd);
  std::int64_t numel = 1;
  for (auto d : shape)
    numel *= d;
  std::vector<float> v(static_cast<std::size_t>(numel));
  for (float& x : v)
    x = n(rng);
  return at::from_blob(v.data(), shape).clone();
}

/// A two-layer perceptron in fp16 on the GPU.
struct Mlp {
  std::vector<at::Tensor> p;
  Mlp() {
    for (auto [shape, seed] :
         {std::pair<std::vector<std::int64_t>, int>{{64, 128}, 11}, {{128}, 12}, {{128, 32}, 13}})
      p.push_back(seeded(shape, seed).to(gpu, at::kHalf).set_requires_grad(true));
  }
  at::Tensor loss(iteration_t k, bool poison) const {
    at::Tensor x = seeded({256, 64}, 100 + std::uint64_t(k)).to(gpu, at::kHalf);
    if (poison) x[0][0].fill_(INFINITY);
    at::Tensor t = seeded({256, 32}, 200 + std::uint64_t(k)).to(gpu, at::kHalf);
    at::Tensor h = at::tanh(at::matmul(x, p[0]) + p[1]);
    at::Tensor d = (at::matmul(h, p[2]) - t).to(at::kFloat);
    return at::mean(d * d);
  }
  void zero_grad() {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
  }
};

bool poisoned(iteration_t k) {
  return k % 7 == 3;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        const std::vector<at::Tensor>& params) {
  if (kind == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  if (kind == "fused-adam")
    return std::make_unique<optim::FusedAdam>(params, torch::optim::AdamOptions(1e-3));
  if (kind == "fused-sgd")
    return std::make_unique<optim::FusedSGD>(params, torch::optim::SGDOptions(0.05));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05));
}

struct Run {
  std::vector<float> scales;
  std::vector<bool> skipped;
  std::vector<at::Tensor> model, masters;  // on the CPU
};

/// n iterations of `kind` with the masters on `masters_on`; ranked: one data-parallel rank
/// (SoloRanks), sharded or not.
Run train(const std::string& kind, std::optional<at::Device> masters_on, int staleness, int n,
          bool ranked = false, bool shard = false) {
  Mlp model;
  GradScalerOptions so = opts(1024, 2, 0.5, 4);
  if (ranked) so.ranks(std::make_shared<test::SoloRanks>());
  GradScaler scaler(so);
  AsyncOptimizerOptions o;
  o.staleness(staleness);
  o.master_device(masters_on);
  o.shard_optimizer_state(shard);
  AsyncOptimizer pipe(model.p, scaler, o);
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(kind, pipe.optim_parameters());
  Run r;
  for (iteration_t k = 0; k < n; ++k) {
    model.zero_grad();
    scaler.scale(model.loss(k, poisoned(k))).backward();
    pipe.step(*opt, [&] { scaler.step(*opt); });
    scaler.update();
    r.scales.push_back(float(scaler.get_scale()));
  }
  pipe.sync();
  for (iteration_t k = 0; k < n; ++k)
    r.skipped.push_back(scaler.wait_result(k).skipped());
  for (std::size_t i = 0; i < model.p.size(); ++i) {
    r.model.push_back(model.p[i].detach().cpu());
    r.masters.push_back(pipe.optim_parameters()[i].detach().cpu().reshape({-1}));
  }
  return r;
}

/// The same shape, dtype and bytes.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         a.contiguous().view(at::kByte).equal(b.contiguous().view(at::kByte));
}

/// The largest |a - b| over the tensors, relative to max |b|.
double max_rel_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double scale = b[i].abs().max().item<double>();
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / std::max(scale, 1e-30));
  }
  return worst;
}

}  // namespace

TEST_CASE(
    "offload, staleness 0: the scale and skips equal the masters-on-GPU run, SGD bit for bit") {
  SKIP_WITHOUT_GPU();
  const int n = 30;
  for (const char* kind : {"sgd", "adam"}) {
    CAPTURE(std::string(kind));
    const Run on_gpu = train(kind, std::nullopt, 0, n);
    const Run on_cpu = train(kind, at::Device(at::kCPU), 0, n);
    CHECK(on_cpu.scales == on_gpu.scales);
    CHECK(on_cpu.skipped == on_gpu.skipped);
    int skips = 0;
    for (bool s : on_cpu.skipped)
      skips += s;
    CHECK(skips == n / 7 + (n % 7 > 3));
    const double masters = max_rel_diff(on_cpu.masters, on_gpu.masters);
    const double model = max_rel_diff(on_cpu.model, on_gpu.model);
    MESSAGE(kind << ": masters differ by at most " << masters << " (relative), the fp16 model by "
                 << model);
    if (std::string(kind) == "sgd") {
      // The grads arrive bit for bit (the same unscale of the same fp16 values); SGD's update is
      // one rounding on either device.
      for (std::size_t i = 0; i < on_cpu.masters.size(); ++i) {
        CHECK(on_cpu.masters[i].equal(on_gpu.masters[i]));
        CHECK(on_cpu.model[i].equal(on_gpu.model[i]));
      }
    } else {
      // Adam's sqrt and division round differently on the two devices: a few ulps per step.
      CHECK(masters < 1e-5);
    }
  }
}

TEST_CASE("offload, staleness 1: iteration k runs on the weights of step k-2, fn overlaps") {
  SKIP_WITHOUT_GPU();
  const int n = 12;
  Mlp model;
  GradScaler scaler(opts(256, 2, 0.5, 1000));
  AsyncOptimizerOptions o;
  o.master_device(at::Device(at::kCPU));
  AsyncOptimizer pipe(model.p, scaler, o);
  CHECK(pipe.staleness() == 1);
  CHECK(pipe.optim_parameters()[0].device().is_cpu());
  CHECK((pipe.optim_parameters()[0].scalar_type() == at::kFloat));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  std::vector<at::Tensor> used(n), after_step(n);
  std::atomic<int> cpu_grads{0};
  for (iteration_t k = 0; k < n; ++k) {
    used[std::size_t(k)] = model.p[0].detach().cpu();  // the weights this forward runs on
    model.zero_grad();
    scaler.scale(model.loss(k, false)).backward();
    pipe.step(opt, [&, k] {
      cpu_grads += pipe.optim_parameters()[0].grad().device().is_cpu();
      scaler.step(opt);
      after_step[std::size_t(k)] = pipe.optim_parameters()[0].detach().to(at::kHalf);
    });
    scaler.update();
  }
  pipe.sync();
  CHECK(used[0].equal(used[1]));  // both before any step landed
  CHECK_FALSE(used[1].equal(after_step[0]));
  for (int k = 2; k < n; ++k) {
    CAPTURE(k);
    CHECK(used[std::size_t(k)].equal(after_step[std::size_t(k - 2)]));
  }
  CHECK(model.p[0].detach().cpu().equal(after_step[n - 1]));  // sync() publishes the last step
  CHECK(cpu_grads == n);  // fn stepped on the masters' grads, on the CPU
  for (iteration_t k = 0; k < n; ++k)
    CHECK_FALSE(scaler.wait_result(k).skipped());
}

TEST_CASE("offload, staleness 1: an overflow is found by the CPU move, skipped, backed off once") {
  SKIP_WITHOUT_GPU();
  Mlp model;
  GradScaler scaler(opts(1024, 2, 0.5, 1000));
  AsyncOptimizerOptions o;
  o.master_device(at::Device(at::kCPU));
  AsyncOptimizer pipe(model.p, scaler, o);
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(0.05));
  const at::Tensor before = pipe.optim_parameters()[0].detach().clone();
  for (iteration_t k = 0; k < 2; ++k) {
    model.zero_grad();
    scaler.scale(model.loss(k, k == 0)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  CHECK(scaler.wait_result(0).skipped());
  CHECK_FALSE(scaler.wait_result(1).skipped());
  CHECK(scaler.get_scale() == 512.0);
  CHECK_FALSE(pipe.optim_parameters()[0].detach().equal(before));  // step 1 landed
}

TEST_CASE(
    "offload with a fused optimizer: equal to torch::optim's (bit for bit but LibTorch 2.x's "
    "Adam), "
    "at staleness 0 and 1") {
  SKIP_WITHOUT_GPU();
  // The fused step reads the pinned fp16 grads and writes the pinned fp16 weights in place; the
  // move path unscales into fp32 grads, torch::optim steps, and the masters are cast. Both
  // unscale with one fp32 product and cast with one rounding: nothing may differ but what
  // LibTorch 2.x's sqrt rounds differently (tensor_helpers.h).
  const int n = 16;
  for (int staleness : {0, 1})
    for (const auto& kinds :
         {std::pair<std::string, std::string>{"fused-adam", "adam"}, {"fused-sgd", "sgd"}}) {
      const std::string& fused = kinds.first;  // no structured binding: CAPTURE's lambda takes it
      const std::string& plain = kinds.second;
      CAPTURE(staleness);
      CAPTURE(fused);
      const Run a = train(fused, at::Device(at::kCPU), staleness, n);
      const Run b = train(plain, at::Device(at::kCPU), staleness, n);
      CHECK(a.scales == b.scales);
      CHECK(a.skipped == b.skipped);
      CHECK(std::count(a.skipped.begin(), a.skipped.end(), true) == n / 7 + (n % 7 > 3));
      const bool exact = ampactor::test::kTorchSqrtRounded || plain == "sgd";
      for (std::size_t i = 0; i < a.masters.size(); ++i) {
        CAPTURE(i);
        if (exact) {
          CHECK(a.masters[i].equal(b.masters[i]));
          CHECK(a.model[i].equal(b.model[i]));
        } else {  // 16 ulps of each tensor's largest value, as tests/test_fused_scalers.cpp
          const double masters = ampactor::test::ulps_apart(a.masters[i], b.masters[i]);
          const double model = ampactor::test::ulps_apart(a.model[i], b.model[i]);
          CHECK((masters >= 0 && masters <= 16));
          CHECK((model >= 0 && model <= 16));
        }
      }
    }
}

TEST_CASE("offload with a fused optimizer: a skipped first step publishes the masters' weights") {
  SKIP_WITHOUT_GPU();
  // The pinned weights are written by the fused step only; a step skipped before any was written
  // must still publish the masters (the model's own weights), never the buffer's garbage.
  for (int staleness : {0, 1}) {
    CAPTURE(staleness);
    Mlp model;
    const at::Tensor start = model.p[0].detach().cpu();
    GradScaler scaler(opts(1024, 2, 0.5, 1000));
    AsyncOptimizerOptions o;
    o.staleness(staleness);
    o.master_device(at::Device(at::kCPU));
    AsyncOptimizer pipe(model.p, scaler, o);
    optim::FusedAdam opt(pipe.optim_parameters(), torch::optim::AdamOptions(1e-3));
    model.zero_grad();
    scaler.scale(model.loss(0, true)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
    pipe.sync();
    CHECK(scaler.wait_result(0).skipped());
    CHECK(scaler.get_scale() == 512.0);
    CHECK(model.p[0].detach().cpu().equal(start));
    CHECK(pipe.optim_parameters()[0].detach().to(at::kHalf).equal(start));
  }
}

TEST_CASE("offload: options that do not apply are refused before anything is queued") {
  SKIP_WITHOUT_GPU();
  Mlp model;
  GradScaler scaler(opts(1024, 2, 0.5, 1000));
  AsyncOptimizerOptions o;
  o.master_device(at::Device(at::kCPU));
  o.swap_weights(true);
  CHECK_THROWS_WITH_AS(AsyncOptimizer(model.p, scaler, o), doctest::Contains("do not apply"),
                       ScalerError);
  o.swap_weights(false);
  o.defer_grad_move(true);
  CHECK_THROWS_WITH_AS(AsyncOptimizer(model.p, scaler, o), doctest::Contains("do not apply"),
                       ScalerError);
  o.defer_grad_move(false);
  std::vector<at::Tensor> mixed = model.p;
  mixed[1] = mixed[1].detach().cpu().set_requires_grad(true);
  CHECK_THROWS_WITH_AS(AsyncOptimizer(mixed, scaler, o), doctest::Contains("one device"),
                       ScalerError);
}

TEST_CASE(
    "offload with shard_optimizer_state (one rank): bit for bit the unsharded offload with ranks, "
    "staleness 0 and 1, LibTorch's Adam and FusedAdam") {
  SKIP_WITHOUT_GPU();
  for (const char* kind : {"adam", "fused-adam"})
    for (int staleness : {0, 1}) {
      CAPTURE(kind);
      CAPTURE(staleness);
      const Run plain = train(kind, at::Device(at::kCPU), staleness, 12, /*ranked=*/true);
      const Run sharded = train(kind, at::Device(at::kCPU), staleness, 12, true, /*shard=*/true);
      CHECK(sharded.scales == plain.scales);
      CHECK(sharded.skipped == plain.skipped);
      CHECK(plain.skipped[3]);
      for (std::size_t i = 0; i < plain.model.size(); ++i) {
        CAPTURE(i);
        CHECK(same_bits(sharded.model[i], plain.model[i]));
        CHECK(same_bits(sharded.masters[i], plain.masters[i]));
      }
    }
}
