// The fused optimizers against torch::optim's, bit for bit: every configuration, gradient dtype,
// layout and poison, 1 and 2 threads; the reference is the pipeline they replace (the grads moved
// into fp32 master grads and unscaled, torch::optim's step, the masters cast to the weights).
// Against LibTorch 2.x, whose sqrt is not correctly rounded, Adam and AdamW are held within
// allowed_ulps() instead (fused_fixture.h).
#include <ampactor/kernels/fused_step.h>

#include <cstdlib>
#include <cstring>

#include "fused_fixture.h"

namespace {

using namespace ampactor::test;
using ampactor::optim::ScaledStep;

// Sizes around the vector width and the loops' tails, and one past the parallel threshold.
const std::int64_t kSizes[] = {1, 7, 8, 33, 1013, 70001};

/// Masters of every size in `layout` (rows x cols views: transposed and sliced are
/// non-contiguous), from `seed`.
std::vector<at::Tensor> masters(Layout layout, std::uint64_t seed) {
  std::vector<at::Tensor> out;
  for (std::int64_t n : kSizes) {
    const std::int64_t rows = n % 2 ? n : 2, cols = n % 2 ? 1 : n / 2;
    out.push_back(make_grad(rows, cols, at::kFloat, layout, seed++) * 0.125);
  }
  return out;
}

struct Run {
  OptConfig config;
  at::ScalarType grad_type = at::kFloat;
  at::ScalarType weight_type = at::kHalf;
  Layout layout = Layout::contiguous;
  Poison poison = Poison::none;
  int threads = 1;
};

/// Four steps of both, at changing scales; checks masters, weights and state after each.
void compare(const Run& r) {
  CAPTURE(r.config.name());
  const std::string grad_type = c10::toString(r.grad_type),
                    weight_type = c10::toString(r.weight_type);
  const std::string layout = name(r.layout), poisoned = name(r.poison);
  CAPTURE(grad_type);
  CAPTURE(weight_type);
  CAPTURE(layout);
  CAPTURE(poisoned);
  CAPTURE(r.threads);
  std::vector<at::Tensor> ref = masters(r.layout, 11), mine = clones(ref), weights;
  for (at::Tensor& m : mine)  // the fused masters in the same layout as the reference's
    if (r.layout == Layout::transposed) m = m.t().contiguous().t();
  for (const at::Tensor& m : mine)
    weights.push_back(m.to(r.weight_type));
  auto torch_opt = make_optimizer(r.config, ref, false);
  auto fused = make_optimizer(r.config, mine, true, r.threads);
  auto* fs = ampactor::optim::fused_step_of(*fused);
  REQUIRE(fs != nullptr);
  const float scales[] = {65536.0f, 65536.0f, 32768.0f, 1.0f};
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    const float inv = 1.0f / scales[step];
    std::vector<at::Tensor> grads;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      at::Tensor g =
          make_grad(ref[i].size(0), ref[i].size(1), at::kFloat, r.layout, 100 + step * 10 + i);
      g = (g * (scales[step] / 64)).to(r.grad_type);
      if (i == 4 && step == 2) poison(g, r.poison, 5);
      grads.push_back(g);
      ref[i].mutable_grad() = g.to(at::kFloat).mul(double(inv));  // the grad move
    }
    torch_opt->step();
    CHECK(fs->step_scaled(ScaledStep().inv_scale(inv).grads(grads).weights(weights)));
    const bool nan_ok = r.poison != Poison::none;
    const double ulps = allowed_ulps(r.config, step + 1);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(i);
      CHECK(agree(mine[i], ref[i], nan_ok, ulps));
      CHECK(agree(weights[i], ref[i].to(r.weight_type), nan_ok, ulps));
    }
    CHECK(same_state(*fused, mine, *torch_opt, ref, nan_ok, ulps));
  }
}

}  // namespace

TEST_CASE(
    "fused optimizers equal torch::optim (bit for bit, LibTorch 2.x Adam within ulps): every "
    "configuration, fp32 grads") {
  for (const OptConfig& c : configs())
    for (int threads : {1, 2})
      compare({c, at::kFloat, at::kFloat, Layout::contiguous, Poison::none, threads});
}

TEST_CASE(
    "fused optimizers equal torch::optim (bit for bit, LibTorch 2.x Adam within ulps): fp16 and "
    "bf16 grads and weights") {
  for (const OptConfig& c : configs())
    for (at::ScalarType t : {at::kHalf, at::kBFloat16})
      compare({c, t, t, Layout::contiguous, Poison::none, 2});
}

TEST_CASE(
    "fused optimizers equal torch::optim (bit for bit, LibTorch 2.x Adam within ulps) on "
    "transposed and sliced parameters") {
  for (const OptConfig& c : configs())
    for (Layout l : {Layout::transposed, Layout::sliced})
      for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16})
        compare({c, t, at::kBFloat16, l, Poison::none, 2});
}

TEST_CASE("fused optimizers equal torch::optim with inf and NaN gradients when nothing skips") {
  for (const OptConfig& c : configs())
    for (Poison p : {Poison::inf, Poison::nan})
      for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16})
        for (Layout l : {Layout::contiguous, Layout::transposed})
          compare({c, t, at::kHalf, l, p, 1});
}

TEST_CASE("the fused step's loops follow ATEN_CPU_CAPABILITY") {
  // ctest runs this binary a second time with ATEN_CPU_CAPABILITY=default: LibTorch then runs its
  // default kernels (no FMA) and the fused steps their baseline loops, and every test above
  // must hold again; and a third time with ATEN_CPU_CAPABILITY=avx2 (LibTorch's AVX2 kernels and
  // the AVX2 loops, which the AVX-512 ones would otherwise hide).
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string variant = ampactor::kernels::fused_step_variant();
  if (cap && std::strcmp(cap, "default") == 0)
    CHECK(variant == "baseline");
  else if (cap && std::strcmp(cap, "avx2") == 0)
    CHECK((variant == "avx2" || variant == "baseline"));
  else
    CHECK((variant == "avx512" || variant == "avx2" || variant == "baseline"));
  MESSAGE("fused step loops: " << variant);
}
