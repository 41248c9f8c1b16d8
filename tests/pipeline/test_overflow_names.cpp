// Which gradients overflowed, named, through the actor-backed scaler and the pipeline:
// IterationResult::overflow (wait_result) and GradScaler::last_overflow(), for GradScaler's own
// unscale, and for AsyncOptimizer's grad move, fused check and overlapped backward.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <string>
#include <vector>

#include "overlap_fixture.h"

using namespace ampactor;
using namespace ampactor::test::overlap;
using ampactor::test::opts;

namespace {

/// The fixture model's parameters as layer names: w0, b0, w1, b1, ...
torch::OrderedDict<std::string, at::Tensor> names_of(const Model& m) {
  torch::OrderedDict<std::string, at::Tensor> named;
  for (std::size_t i = 0; i < m.p.size(); ++i)
    named.insert((i % 2 ? "b" : "w") + std::to_string(i / 2), m.p[i]);
  return named;
}

std::vector<std::string> names(const std::vector<OverflowTensor>& ts) {
  std::vector<std::string> out;
  for (const OverflowTensor& t : ts)
    out.push_back(t.name + (t.inf ? ":inf" : "") + (t.nan ? ":nan" : ""));
  return out;
}

enum class Way { move, fused, overlap };

/// Six iterations, an overflow in the first layer's weight alone at iteration 3 (the fixture's
/// spike): what each iteration's result names, at the given staleness.
std::vector<std::vector<std::string>> run(Way way, int staleness) {
  Model m(at::kHalf);
  GradScaler scaler(opts(1024, 2, 0.5, 100).allow_fp16_grads(true));
  auto o = AsyncOptimizerOptions().staleness(staleness);
  if (way == Way::overlap) o.overlap_backward(true).bucket_bytes(24 * 24 * 4);
  AsyncOptimizer pipe(m.p, scaler, o);
  pipe.name_parameters(names_of(m));
  torch::optim::Optimizer& opt =
      way == Way::move
          ? static_cast<torch::optim::Optimizer&>(
                pipe.make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)))
          : pipe.make_optimizer<optim::FusedAdam>(torch::optim::AdamOptions(1e-3));
  for (int k = 0; k < 6; ++k) {
    m.zero_grad();
    scaler.scale(m.loss(k, k == 3 ? 1e36f : 0.0f, false)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  std::vector<std::vector<std::string>> out;
  for (int k = 0; k < 6; ++k)
    out.push_back(names(scaler.wait_result(k).overflow));
  REQUIRE(scaler.last_overflow());
  CHECK(scaler.last_overflow()->iteration == 3);
  CHECK(scaler.last_overflow()->scale == 1024.0);
  CHECK(scaler.last_overflow()->str().find("w0 held inf") != std::string::npos);
  return out;
}

}  // namespace

TEST_CASE("the pipeline names the layer that overflowed: move, fused check, overlapped backward") {
  const std::vector<std::vector<std::string>> want = {{}, {}, {}, {"w0:inf"}, {}, {}};
  CHECK(run(Way::move, 0) == want);
  CHECK(run(Way::move, 1) == want);
  CHECK(run(Way::fused, 0) == want);
  CHECK(run(Way::fused, 1) == want);
  CHECK(run(Way::overlap, 0) == want);
}

TEST_CASE("GradScaler names the gradients that held inf or NaN, unnamed ones by index") {
  std::vector<at::Tensor> p;
  torch::OrderedDict<std::string, at::Tensor> named;
  for (int i = 0; i < 4; ++i) {
    p.push_back(at::zeros({8}).set_requires_grad(true));
    if (i != 2) named.insert("p" + std::to_string(i), p.back());
  }
  torch::optim::SGD opt(p, torch::optim::SGDOptions(0.1));
  GradScaler scaler(opts(256, 2, 0.5, 100));
  scaler.name_parameters(named);
  CHECK_FALSE(scaler.last_overflow());
  for (int k = 0; k < 3; ++k) {
    for (auto& t : p)
      t.mutable_grad() = at::ones({8});
    if (k == 1) {
      p[1].mutable_grad()[3] = INFINITY;
      p[2].mutable_grad()[0] = NAN;
    }
    scaler.scale(at::ones({}));
    scaler.step(opt);
    scaler.update();
  }
  CHECK(names(scaler.wait_result(0).overflow).empty());
  CHECK(names(scaler.wait_result(1).overflow) == std::vector<std::string>{"p1:inf", "param 2:nan"});
  CHECK(names(scaler.wait_result(2).overflow).empty());
  // Its neighbours p0 and p2 (p2's only finite values are 1/256 after the unscale; p0's too).
  CHECK(scaler.wait_result(1).overflow[0].neighbours_max == 1.0 / 256);
  REQUIRE(scaler.last_overflow());
  CHECK(scaler.last_overflow()->iteration == 1);
}
