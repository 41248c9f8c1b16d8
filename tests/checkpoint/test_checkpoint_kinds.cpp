// Every kind of checkpoint ampactor's save paths write passes load_checkpoint's checks and loads
// as it was saved: the scalers, models, torch::optim's optimizers and ampactor's fused ones, every
// value and tensor layout an archive can hold, archives nested in any order. (GradScaler and
// AsyncOptimizer checkpoints: test_checkpoint_pipeline.cpp, whose archives are read through
// load_checkpoint, and test_checkpoint_kill.cpp.)
#include "doctest_torch.h"

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/optim/fused.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "archive_fixture.h"
#include "checkpoint_fixture.h"

using namespace ampactor;
using ampactor::test::archive_of;
using ampactor::test::bytes_of;

namespace {

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && torch::equal(a, b);
}

}  // namespace

TEST_CASE("LocalGradScaler checkpoints load through load_checkpoint, however they were written") {
  test::TempDir dir;
  LocalGradScaler a(GradScalerOptions().init_scale(96).growth_interval(7));
  a.load_state_dict([&] {
    StateDict sd = a.state_dict();
    sd.set("_growth_tracker", std::int64_t(3));
    return sd;
  }());
  torch::serialize::OutputArchive out;
  a.save(out);
  save_atomically(out, dir / "atomic.pt");
  torch::save(a, dir / "scaler.pt");  // LibTorch's writer names the archive's folder "scaler"
  for (const char* file : {"atomic.pt", "scaler.pt"}) {
    CAPTURE(file);
    torch::serialize::InputArchive in;
    load_checkpoint(in, dir / file);
    LocalGradScaler b;
    b.load(in);
    CHECK(b.state_dict() == a.state_dict());
  }
  torch::save(LocalGradScaler(GradScalerOptions().enabled(false)), dir / "off.pt");
  torch::serialize::InputArchive in;
  load_checkpoint(in, dir / "off.pt");  // a module without attributes
  CHECK(in.keys().empty());
}

TEST_CASE("A model's checkpoint loads: parameters, buffers, nested modules") {
  struct Net : torch::nn::Module {
    Net() {
      body = register_module(
          "body", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8)));
      head = register_module("head", torch::nn::Linear(8, 2));
    }
    torch::nn::Sequential body;
    torch::nn::Linear head{nullptr};
  };
  torch::manual_seed(3);
  Net a, b;
  a.train(), a.body->forward(torch::randn({5, 4}));  // running stats and a batch count (int64)
  torch::serialize::OutputArchive out;
  a.save(out);
  torch::serialize::InputArchive in = archive_of(bytes_of(out));
  b.load(in);
  const auto bp = b.named_parameters(), bb = b.named_buffers();
  for (const auto& p : a.named_parameters())
    CHECK(same(p.value(), bp[p.key()]));
  for (const auto& p : a.named_buffers())
    CHECK(same(p.value(), bb[p.key()]));
  CHECK(a.named_buffers().size() == 3);
}

// LBFGS is left out: LibTorch 1.13 cannot write its state (undefined tensors in it).
TEST_CASE("torch::optim's optimizers' checkpoints load (LBFGS aside), and the fused ones'") {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  const std::pair<const char*, Make> optimizers[] = {
      {"SGD",
       [](auto p) {
         return std::make_unique<torch::optim::SGD>(
             p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
       }},
      {"Adam",
       [](auto p) {
         return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions().amsgrad(true));
       }},
      {"AdamW", [](auto p) { return std::make_unique<torch::optim::AdamW>(p); }},
      {"RMSprop",
       [](auto p) {
         return std::make_unique<torch::optim::RMSprop>(
             p, torch::optim::RMSpropOptions().centered(true).momentum(0.5));
       }},
      {"Adagrad", [](auto p) { return std::make_unique<torch::optim::Adagrad>(p); }},
      {"FusedAdam", [](auto p) { return std::make_unique<optim::FusedAdam>(p); }},
      {"FusedAdamW", [](auto p) { return std::make_unique<optim::FusedAdamW>(p); }},
      {"FusedSGD",
       [](auto p) {
         return std::make_unique<optim::FusedSGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
       }},
  };
  for (const auto& [name_, make] : optimizers) {
    const std::string name = name_;
    CAPTURE(name);
    torch::manual_seed(5);
    std::vector<at::Tensor> params{torch::randn({3, 4}).requires_grad_(),
                                   torch::randn({4}).requires_grad_()};
    auto opt = make(params);
    for (int step = 0; step < 2; ++step)
      opt->step([&] {
        opt->zero_grad();
        at::Tensor loss = (params[0].sum(0) * params[1]).pow(2).sum();
        loss.backward();
        return loss;
      });
    torch::serialize::OutputArchive out;
    opt->save(out);
    torch::serialize::InputArchive in = archive_of(bytes_of(out));
    auto again = make({params[0].detach().clone(), params[1].detach().clone()});
    again->load(in);
    CHECK(again->state().size() == opt->state().size());
  }
}

TEST_CASE("Every value and tensor layout an archive holds loads as it was saved") {
  const torch::Tensor base = torch::arange(24, torch::kFloat).reshape({2, 3, 4});
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"transposed", base.transpose(0, 2)},
      {"offset", base.select(0, 1).narrow(1, 1, 2)},
      {"expanded", torch::ones({1, 3}).expand({5, 3})},
      {"scalar", torch::tensor(2.5, torch::kDouble)},
      {"empty", torch::empty({0, 3}, torch::kLong)},
      {"half", base.to(torch::kHalf)},
      {"bfloat16", base.to(torch::kBFloat16)},
      {"bool", base.gt(10)},
      {"int8", base.to(torch::kChar)},
      {"uint8", base.to(torch::kByte)},
      {"int16", base.to(torch::kShort)},
      {"int32", base.to(torch::kInt)},
      {"complex", torch::complex(base, base)},
  };
  torch::serialize::OutputArchive out;
  for (const auto& [k, t] : tensors)
    out.write(k, t);
  out.write("text", c10::IValue(std::string("a \"quoted\" text\n")));
  out.write("none", c10::IValue());
  out.write("yes", c10::IValue(true));
  out.write("pair", c10::IValue(std::make_tuple(1.5, std::int64_t(-7))));
  out.write("nested", c10::IValue(std::make_tuple(std::make_tuple(std::string("x")), true)));
  out.write("big", c10::IValue(std::int64_t(1) << 40));
  out.write("negative", c10::IValue(std::int64_t(-300000)));
  out.write("param/0 weird-name.x", torch::ones({2}), /*is_buffer=*/true);
  torch::serialize::InputArchive in = archive_of(bytes_of(out));
  for (const auto& kt : tensors) {
    CAPTURE(kt.first);
    torch::Tensor back;
    REQUIRE(in.try_read(kt.first, back));
    CHECK(same(back, kt.second));
  }
  c10::IValue v;
  CHECK((in.try_read("text", v) && v.toStringRef() == "a \"quoted\" text\n"));
  CHECK((in.try_read("none", v) && v.isNone()));
  CHECK((in.try_read("yes", v) && v.toBool()));
  CHECK((in.try_read("pair", v) && v.toTuple()->elements().at(1).toInt() == -7));
  CHECK((in.try_read("nested", v) &&
         v.toTuple()->elements().at(0).toTuple()->elements().at(0).toStringRef() == "x"));
  CHECK((in.try_read("big", v) && v.toInt() == std::int64_t(1) << 40));
  CHECK((in.try_read("negative", v) && v.toInt() == -300000));
  torch::Tensor weird;
  CHECK((in.try_read("param/0 weird-name.x", weird, true) && weird.sum().item<float>() == 2));
}

TEST_CASE("Nested archives load whether they share the root's compilation unit or not") {
  for (bool shared : {true, false}) {
    for (bool child_first : {true, false}) {
      CAPTURE(shared);
      CAPTURE(child_first);
      auto cu = std::make_shared<torch::jit::CompilationUnit>();
      // The archive made first takes the plain class name, the other a mangled one.
      torch::serialize::OutputArchive first(cu),
          second(shared ? cu : std::make_shared<torch::jit::CompilationUnit>());
      torch::serialize::OutputArchive& child = child_first ? first : second;
      torch::serialize::OutputArchive& root = child_first ? second : first;
      torch::serialize::OutputArchive grandchild(cu);
      grandchild.write("g", c10::IValue(std::int64_t(9)));
      child.write("c", c10::IValue(1.25));
      child.write("grand", grandchild);
      root.write("child", child);
      root.write("again", child);  // one module twice
      torch::serialize::InputArchive in = archive_of(bytes_of(root)), c, g;
      REQUIRE(in.try_read("again", c));
      REQUIRE(c.try_read("grand", g));
      c10::IValue v;
      CHECK((g.try_read("g", v) && v.toInt() == 9));
    }
  }
}
