// save_run / load_run: a whole run (model, optimizer, scaler, pipeline) in one file, loaded
// whole or not at all.
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <memory>
#include <string>

#include "checkpoint_fixture.h"
#include "tensor_helpers.h"

using namespace ampactor;

namespace {

/// A small fp32 MLP trained by Adam on the optimizer thread, at staleness 0.
struct Run {
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<AsyncOptimizer> pipe;
  torch::optim::Adam* opt = nullptr;
  int done = 0;

  Run(std::int64_t width, float init_scale) {
    torch::manual_seed(1);
    model = torch::nn::Sequential(torch::nn::Linear(4, width), torch::nn::Tanh(),
                                  torch::nn::Linear(width, 1));
    scaler =
        std::make_unique<GradScaler>(GradScalerOptions().init_scale(init_scale).growth_interval(2));
    pipe = std::make_unique<AsyncOptimizer>(model->parameters(), *scaler,
                                            AsyncOptimizerOptions().staleness(0));
    opt = &pipe->make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i, ++done) {
      torch::manual_seed(100 + done);  // the data of iteration `done`
      model->zero_grad();
      scaler->scale(model->forward(at::randn({16, 4})).pow(2).mean()).backward();
      pipe->step(*opt, [&] { scaler->step(*opt); });
      scaler->update();
    }
    pipe->sync();
  }
  RunParts parts() {
    return RunParts().model(model.get()).optimizer(opt).scaler(scaler.get()).pipeline(pipe.get());
  }
  /// Everything a load may change: the weights, the masters, Adam's moments, the scale.
  std::vector<at::Tensor> state() const {
    std::vector<at::Tensor> out = test::clones(model->parameters());
    for (const at::Tensor& m : pipe->optim_parameters()) {
      out.push_back(m.detach().clone());
      auto* st = optim::param_state(*opt, m);
      if (!st) continue;
      auto& s = static_cast<torch::optim::AdamParamState&>(*st);
      out.push_back(s.exp_avg().clone()), out.push_back(s.exp_avg_sq().clone());
    }
    out.push_back(at::full({}, double(scaler->get_scale())));
    return out;
  }
};

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!test::same_values(a[i], b[i])) return false;
  return true;
}

/// What load_run throws (bad_checkpoint expected), or "" when it loads.
std::string refusal(const std::string& path, const RunParts& parts) {
  try {
    load_run(path, parts);
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_checkpoint);
    return e.what();
  }
  return {};
}

/// Another model's run (16 hidden units where the tests' have 8), 2 steps in, saved at `path`.
void save_wider_run(const std::string& path) {
  Run other(16, 1024);
  other.train(2);
  save_run(path, other.parts(), 2);
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("load_run: a saved run loads whole into fresh objects and continues bit for bit") {
  test::TempDir dir;
  Run a(8, 1024);
  a.train(3);
  save_run(dir / "run.pt", a.parts(), a.done);
  a.train(3);
  Run b(8, 64);  // another scale: the file's must win
  CHECK(load_run(dir / "run.pt", b.parts()) == 3);
  b.done = 3;
  b.train(3);
  CHECK(same(b.state(), a.state()));
}

TEST_CASE("load_run: another model's checkpoint is refused naming the parameter, nothing changed") {
  test::TempDir dir;
  save_wider_run(dir / "other.pt");
  Run b(8, 64);
  b.train(2);
  const std::vector<at::Tensor> before = b.state();
  const std::string what = refusal(dir / "other.pt", b.parts());
  CHECK(has(what, "load_run: model: 0.weight is [16, 4]"));
  CHECK(has(what, "nothing was changed"));
  CHECK(same(b.state(), before));
}

TEST_CASE("load_run: an optimizer whose state does not fit its parameters is put back") {
  test::TempDir dir;
  save_wider_run(dir / "other.pt");
  Run b(8, 64);
  b.train(2);
  const std::vector<at::Tensor> before = b.state();
  // Without the model, the optimizer is the first part to see the other shapes: LibTorch loads
  // it without a word, the check after finds them and the snapshot is put back.
  const std::string what =
      refusal(dir / "other.pt", RunParts().optimizer(b.opt).scaler(b.scaler.get()));
  CHECK(has(what, "load_run: optimizer: the state of parameter 0 is [16, 4]"));
  CHECK(same(b.state(), before));
  b.train(1);  // and the run goes on
}

TEST_CASE("load_run: a pipeline part that refuses leaves the scaler and the model as they were") {
  test::TempDir dir;
  Run a(8, 4096);
  a.train(3);
  // The same run, its pipeline part written by a future version.
  torch::serialize::OutputArchive all, m(all.compilation_unit()), o(all.compilation_unit()),
      s(all.compilation_unit()), p(all.compilation_unit());
  a.pipe->save(p);
  p.write("format", c10::IValue(std::int64_t(99)));
  a.model->save(m), a.opt->save(o), a.scaler->save(s);
  all.write("step", c10::IValue(std::int64_t(3)));
  all.write("model", m), all.write("optimizer", o), all.write("scaler", s),
      all.write("pipeline", p);
  save_atomically(all, dir / "future.pt");
  Run b(8, 64);
  b.train(1);
  const std::vector<at::Tensor> before = b.state();
  const std::string what = refusal(dir / "future.pt", b.parts());
  CHECK(has(what, "load_run: pipeline: AsyncOptimizer checkpoint: format 99"));
  CHECK(same(b.state(), before));
}

TEST_CASE(
    "load_run: a part the run has and the file lacks is refused, one the run leaves out is not "
    "read") {
  test::TempDir dir;
  Run a(8, 1024);
  a.train(2);
  save_run(dir / "weights.pt", RunParts().model(a.model.get()), 2);
  Run b(8, 64);
  b.train(1);
  const std::vector<at::Tensor> before = b.state();
  CHECK(has(refusal(dir / "weights.pt", b.parts()),
            "load_run: optimizer: the file has no such part"));
  CHECK(same(b.state(), before));
  // The model alone, for evaluation: its weights are the file's.
  Run c(8, 64);
  CHECK(load_run(dir / "weights.pt", RunParts().model(c.model.get())) == 2);
  for (std::size_t i = 0; i < a.model->parameters().size(); ++i)
    CHECK(test::same_values(c.model->parameters()[i], a.model->parameters()[i]));
  CHECK(has(refusal(dir / "missing.pt", b.parts()), "missing.pt"));
}
