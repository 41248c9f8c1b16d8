// load_run and the optimizer: each param group's options restored (LibTorch 1.13's load drops
// them), another kind or layout refused by name without LibTorch's text, and a path that is not
// a regular file refused naming it.
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <sys/stat.h>

#include <memory>
#include <string>

#include "checkpoint_fixture.h"
#include "tensor_helpers.h"

using namespace ampactor;
namespace o = torch::optim;

namespace {

/// A linear model and an optimizer of kind Opt over it (two param groups where `groups` is 2),
/// with a few steps taken.
template <class Opt, class Options>
struct Plain {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<Opt> opt;
  Plain(const Options& options, int groups = 1) {
    torch::manual_seed(3);
    model = torch::nn::Linear(4, 2);
    if (groups == 1) {
      opt = std::make_unique<Opt>(model->parameters(), options);
    } else {
      std::vector<o::OptimizerParamGroup> g;
      g.emplace_back(std::vector<at::Tensor>{model->weight});
      g.emplace_back(std::vector<at::Tensor>{model->bias});
      opt = std::make_unique<Opt>(g, options);
    }
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      torch::manual_seed(50 + i);
      opt->zero_grad();
      model->forward(at::randn({8, 4})).pow(2).mean().backward();
      opt->step();
    }
  }
  RunParts parts() { return RunParts().model(model.get()).optimizer(opt.get()); }
  Options& options(std::size_t group = 0) {
    return static_cast<Options&>(opt->param_groups()[group].options());
  }
};

using AdamRun = Plain<o::Adam, o::AdamOptions>;
using SgdRun = Plain<o::SGD, o::SGDOptions>;

std::string refusal(const std::string& path, const RunParts& parts) {
  try {
    load_run(path, parts);
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_checkpoint);
    return e.what();
  }
  return {};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// No LibTorch assert text or backtrace in a refusal.
void check_plain(const std::string& what) {
  CHECK_MESSAGE(!has(what, "INTERNAL ASSERT"), what);
  CHECK_MESSAGE(!has(what, "please report a bug"), what);
  CHECK_MESSAGE(!has(what, "frame #"), what);
  CHECK_MESSAGE(what.find('\n') == std::string::npos, what);
}

}  // namespace

TEST_CASE("load_run restores Adam's options: an lr a schedule changed resumes as saved") {
  test::TempDir dir;
  AdamRun a(o::AdamOptions(1e-2));
  a.train(2);
  a.options().lr(1e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.01);
  save_run(dir / "run.pt", a.parts(), 2);
  a.train(2);

  AdamRun b(o::AdamOptions(1e-2));
  CHECK(load_run(dir / "run.pt", b.parts()) == 2);
  CHECK(b.options().lr() == 1e-3);
  CHECK(b.options().betas() == std::make_tuple(0.8, 0.95));
  CHECK(b.options().eps() == 1e-6);
  CHECK(b.options().weight_decay() == 0.01);
  b.train(2);
  CHECK(test::same_values(b.model->weight, a.model->weight));
}

TEST_CASE("load_run restores SGD's options in every param group") {
  test::TempDir dir;
  SgdRun a(o::SGDOptions(0.1).momentum(0.9), 2);
  a.train(2);
  a.options(0).lr(0.05).dampening(0.1).weight_decay(1e-4);
  a.options(1).lr(0.02).momentum(0.5).dampening(0).nesterov(true);
  save_run(dir / "run.pt", a.parts(), 2);
  SgdRun b(o::SGDOptions(0.1).momentum(0.9), 2);
  load_run(dir / "run.pt", b.parts());
  CHECK(b.options(0).lr() == 0.05);
  CHECK(b.options(0).momentum() == 0.9);
  CHECK(b.options(0).dampening() == 0.1);
  CHECK(b.options(0).weight_decay() == 1e-4);
  CHECK(b.options(1).lr() == 0.02);
  CHECK(b.options(1).momentum() == 0.5);
  CHECK(b.options(1).nesterov());
}

TEST_CASE("load_run refuses an AdamW run into an Adam, naming both, nothing changed") {
  test::TempDir dir;
  Plain<o::AdamW, o::AdamWOptions> w(o::AdamWOptions(1e-2));
  w.train(2);
  save_run(dir / "run.pt", w.parts(), 2);
  AdamRun b(o::AdamOptions(1e-2));
  b.train(1);
  const at::Tensor before = b.model->weight.detach().clone();
  const std::string what = refusal(dir / "run.pt", b.parts());
  CHECK_MESSAGE(has(what,
                    "load_run: optimizer: the file holds AdamW's state, this optimizer is "
                    "Adam; nothing was changed"),
                what);
  CHECK(test::same_values(b.model->weight, before));
  CHECK(b.options().lr() == 1e-2);
}

TEST_CASE("load_run refuses an SGD run into an Adam by name, without LibTorch's assert") {
  test::TempDir dir;
  SgdRun s(o::SGDOptions(0.1).momentum(0.9));
  s.train(2);
  save_run(dir / "run.pt", s.parts(), 2);
  AdamRun b(o::AdamOptions(1e-2));
  const std::string what = refusal(dir / "run.pt", b.parts());
  CHECK_MESSAGE(has(what, "the file holds SGD's state, this optimizer is Adam"), what);
  check_plain(what);
}

TEST_CASE("load_run refuses another param-group layout, naming both") {
  test::TempDir dir;
  SgdRun two(o::SGDOptions(0.1), 2);
  two.train(1);
  save_run(dir / "run.pt", two.parts(), 1);
  SgdRun one(o::SGDOptions(0.1));
  const std::string what = refusal(dir / "run.pt", one.parts());
  CHECK_MESSAGE(has(what,
                    "the file's optimizer has 2 param groups (of 1 and 1 parameters), this "
                    "one 1 param group (of 2 parameters)"),
                what);
  check_plain(what);
}

TEST_CASE("load_run refuses an option the optimizer's constructor would refuse, naming it") {
  test::TempDir dir;
  AdamRun a(o::AdamOptions(1e-2));
  a.options().lr(-1.0);
  save_run(dir / "neg.pt", a.parts(), 0);
  a.options().lr(1e-2).betas({0.9, 1.0});
  save_run(dir / "beta.pt", a.parts(), 0);
  AdamRun b(o::AdamOptions(1e-2));
  CHECK(has(refusal(dir / "neg.pt", b.parts()),
            "param group 0's option 'lr' is -1, not finite and >= 0"));
  CHECK(has(refusal(dir / "beta.pt", b.parts()),
            "param group 0's option 'betas' is 1, outside [0, 1)"));
  CHECK(b.options().lr() == 1e-2);
}

TEST_CASE("load_run refuses a directory, a FIFO and /dev/zero by name, without waiting") {
  test::TempDir dir;
  AdamRun b(o::AdamOptions(1e-2));
  CHECK(has(refusal(dir.path(), b.parts()),
            "'" + dir.path() + "' is a directory, not a regular file"));
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK(has(refusal(dir / "fifo", b.parts()), "is a FIFO, not a regular file"));
  REQUIRE(::symlink("/dev/zero", (dir / "zero").c_str()) == 0);
  CHECK(has(refusal(dir / "zero", b.parts()), "is a character device, not a regular file"));
}
