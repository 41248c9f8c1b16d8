// LocalGradScaler::last_overflow(): which gradients held inf or NaN, named, from the kernels'
// attribution; with LibTorch's optimizers (the gradients unscaled in place) and the fused ones
// (checked at the scale), in every gradient dtype and layout.
#include "doctest_torch.h"

#include <ampactor/optim/fused.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tensor_helpers.h"

using namespace ampactor;
using namespace ampactor::test;

namespace {

constexpr double kScale = 65536.0;

/// Five parameters whose gradients are set by hand, at the scale; named fc0.weight ... fc4.weight.
struct Params {
  std::vector<at::Tensor> p;
  torch::OrderedDict<std::string, at::Tensor> named;
  Params(at::ScalarType dtype, Layout l) {
    for (int i = 0; i < 5; ++i) {
      // fp32 parameters, gradients of `dtype` (every step here is skipped: nothing mixes them).
      p.push_back(at::zeros({16, 12}).set_requires_grad(true));
      p.back().mutable_grad() = make_grad(16, 12, dtype, l, 10 + std::uint64_t(i));
      named.insert("fc" + std::to_string(i) + ".weight", p.back());
    }
  }
  /// The largest finite |grad| of parameter i, true size (made at kScale).
  double true_max(std::size_t i) const {
    at::Tensor a = p[i].grad().to(at::kDouble).abs();
    return at::where(at::isfinite(a), a, at::zeros_like(a)).max().item<double>() / kScale;
  }
};

GradScalerOptions opts() {
  return GradScalerOptions().init_scale(kScale).allow_fp16_grads(true);
}

/// SGD over ps: ampactor's fused one (checked at the scale) or LibTorch's (unscaled in place).
std::unique_ptr<torch::optim::Optimizer> sgd(bool fused, const std::vector<at::Tensor>& ps) {
  if (fused) return std::make_unique<optim::FusedSGD>(ps, torch::optim::SGDOptions(0.1));
  return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1));
}

void plant(Params& ps) {
  poison(ps.p[1].mutable_grad(), Poison::inf, 17);
  poison(ps.p[3].mutable_grad(), Poison::nan, 5);
  poison(ps.p[4].mutable_grad(), Poison::inf, 0);
  poison(ps.p[4].mutable_grad(), Poison::nan, 100);
}

}  // namespace

TEST_CASE("last_overflow names the gradients that held inf or NaN, every dtype and layout") {
  for (bool fused : {false, true})
    for (at::ScalarType dtype : kGradTypes)
      for (Layout l : kLayouts) {
        CAPTURE(fused);
        CAPTURE(c10::toString(dtype));
        CAPTURE(name(l));
        Params ps(dtype, l);
        plant(ps);
        // Each neighbour's largest finite |grad|, before the unscale changes the gradients.
        const double n1 = std::max(ps.true_max(0), ps.true_max(2)),
                     n3 = std::max(ps.true_max(2), ps.true_max(4)), n4 = ps.true_max(3);
        const auto opt = sgd(fused, ps.p);
        LocalGradScaler scaler(opts());
        scaler.name_parameters(ps.named);
        scaler.scale(at::ones({}));
        CHECK_FALSE(scaler.last_overflow());
        CHECK_FALSE(scaler.step(*opt).has_value());
        scaler.update();
        REQUIRE(scaler.last_overflow());
        const OverflowReport& r = *scaler.last_overflow();
        CHECK(r.iteration == 0);
        CHECK(r.scale == kScale);
        REQUIRE(r.tensors.size() == 3);
        CHECK(r.tensors[0].name == "fc1.weight");
        CHECK(r.tensors[0].index == 1);
        CHECK((r.tensors[0].inf && !r.tensors[0].nan));
        CHECK(r.tensors[1].name == "fc3.weight");
        CHECK((!r.tensors[1].inf && r.tensors[1].nan));
        CHECK(r.tensors[2].name == "fc4.weight");
        CHECK((r.tensors[2].inf && r.tensors[2].nan));
        // Divided by a power of two, in range: exact in every dtype.
        CHECK(r.tensors[0].neighbours_max == doctest::Approx(n1).epsilon(1e-6));
        CHECK(r.tensors[1].neighbours_max == doctest::Approx(n3).epsilon(1e-6));
        CHECK(r.tensors[2].neighbours_max == doctest::Approx(n4).epsilon(1e-6));
      }
}

TEST_CASE(
    "last_overflow: unnamed parameters by index, and a clean iteration keeps the last report") {
  Params ps(at::kFloat, Layout::contiguous);
  torch::optim::SGD opt(ps.p, torch::optim::SGDOptions(0.1));
  LocalGradScaler scaler(opts());
  scaler.scale(at::ones({}));
  scaler.step(opt);  // clean
  scaler.update();
  CHECK_FALSE(scaler.last_overflow());
  poison(ps.p[2].mutable_grad(), Poison::nan, 3);
  scaler.step(opt);
  scaler.update();
  REQUIRE(scaler.last_overflow());
  CHECK(scaler.last_overflow()->iteration == 1);
  REQUIRE(scaler.last_overflow()->tensors.size() == 1);
  CHECK(scaler.last_overflow()->tensors[0].name == "param 2");
  CHECK(scaler.last_overflow()->str().find("param 2 held NaN") != std::string::npos);
  for (auto& p : ps.p)
    p.mutable_grad() = at::ones({16, 12});
  scaler.step(opt);  // clean again: the report of iteration 1 stays
  scaler.update();
  CHECK(scaler.last_overflow()->iteration == 1);
}

TEST_CASE("last_overflow names the gradients of a list that mixes dtypes, fused or not") {
  for (bool fused : {false, true}) {
    CAPTURE(fused);
    // fc0 fp32, fc1 fp16, fc2 bf16, fc3 fp16, fc4 fp32: each dtype measured on its own.
    Params ps(at::kFloat, Layout::contiguous);
    const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kHalf, at::kFloat};
    for (std::size_t i = 0; i < ps.p.size(); ++i)
      ps.p[i].mutable_grad() = ps.p[i].grad().to(dtypes[i]);
    poison(ps.p[3].mutable_grad(), Poison::inf, 7);
    poison(ps.p[2].mutable_grad(), Poison::nan, 1);
    const auto opt = sgd(fused, ps.p);
    LocalGradScaler scaler(opts());
    scaler.name_parameters(ps.named);
    scaler.scale(at::ones({}));
    CHECK_FALSE(scaler.step(*opt).has_value());
    scaler.update();
    REQUIRE(scaler.last_overflow());
    const auto& ts = scaler.last_overflow()->tensors;
    REQUIRE(ts.size() == 2);
    CHECK(ts[0].name == "fc2.weight");
    CHECK((ts[0].nan && !ts[0].inf));
    CHECK(ts[1].name == "fc3.weight");
    CHECK((ts[1].inf && !ts[1].nan));
  }
}
