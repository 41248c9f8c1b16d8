// Checkpoints of GradScaler and AsyncOptimizer in one process: a run saved mid-way and continued
// by fresh objects equals the run never interrupted, bit for bit; bad checkpoints change nothing.
#include "async_optimizer_fixture.h"

#include <ampactor/actors/checkpoint.h>

#include <torch/serialize.h>

#include <iostream>
#include <sstream>

#include "archive_fixture.h"
#include "checkpoint_fixture.h"

namespace {

/// Mlp's parameters stored in fp16; the forward casts them to fp32 (LibTorch's CPU kernels have
/// no fp16 matmul), so their grads come back in fp16 and may overflow.
struct HalfMlp {
  std::vector<at::Tensor> p;
  HalfMlp() {
    for (const at::Tensor& t : Mlp().p)
      p.push_back(t.detach().to(at::kHalf).set_requires_grad(true));
  }
  at::Tensor loss(iteration_t k, bool poison) const {
    at::Tensor x = seeded({32, 8}, 100 + std::uint64_t(k));
    if (poison) x[0][0].fill_(INFINITY);
    at::Tensor t = seeded({32, 4}, 200 + std::uint64_t(k));
    at::Tensor h = at::tanh(at::matmul(x, p[0].to(at::kFloat)) + p[1].to(at::kFloat));
    at::Tensor d = at::matmul(h, p[2].to(at::kFloat)) - t;
    return at::mean(d * d) * 1000;  // large enough that fp16 grads overflow at 65536
  }
};

struct Config {
  std::string optimizer;
  int staleness;
  bool swap_defer;
  bool overlap = false;  // overlap_backward (a fused optimizer)
};

struct Outcome {
  std::vector<at::Tensor> model, masters;
  StateDict scaler;
};

void write_params(torch::serialize::OutputArchive& a, const std::vector<at::Tensor>& ps) {
  for (std::size_t i = 0; i < ps.size(); ++i)
    a.write(std::to_string(i), ps[i]);
}

/// Trains iterations [from, to). `load`: a checkpoint to start from. `save_after`: write one
/// into *saved after that iteration (as the example does: pipeline first, then the rest).
Outcome train(const Config& c, iteration_t from, iteration_t to, const std::string* load,
              iteration_t save_after = -1, std::string* saved = nullptr) {
  HalfMlp m;
  GradScaler scaler(GradScalerOptions().growth_interval(3));
  AsyncOptimizer pipe(m.p, scaler,
                      AsyncOptimizerOptions()
                          .staleness(c.staleness)
                          .swap_weights(c.swap_defer)
                          .defer_grad_move(c.swap_defer)
                          .overlap_backward(c.overlap)
                          .bucket_bytes(64));
  auto opt = make_optimizer(c.optimizer, pipe.optim_parameters());
  if (load) {
    torch::serialize::InputArchive all = ampactor::test::archive_of(*load), model, o, s, p;
    all.read("model", model), all.read("optimizer", o), all.read("scaler", s);
    all.read("pipeline", p);
    for (std::size_t i = 0; i < m.p.size(); ++i)
      model.read(std::to_string(i), m.p[i]);
    opt->load(o), scaler.load(s), pipe.load(p);
  }
  for (iteration_t k = from; k < to; ++k) {
    scaler.scale(m.loss(k, poisoned(k))).backward();
    pipe.step(*opt, [&] { scaler.step(*opt); });
    if (!c.swap_defer)
      for (at::Tensor& t : m.p)
        t.mutable_grad() = at::Tensor();
    scaler.update();
    if (k == save_after) {
      torch::serialize::OutputArchive all;
      torch::serialize::OutputArchive model(all.compilation_unit()), o(all.compilation_unit()),
          s(all.compilation_unit()), p(all.compilation_unit());
      pipe.save(p);
      write_params(model, m.p), opt->save(o), scaler.save(s);
      all.write("model", model), all.write("optimizer", o), all.write("scaler", s);
      all.write("pipeline", p);
      *saved = ampactor::test::bytes_of(all);
    }
  }
  pipe.sync();
  Outcome r;
  for (const at::Tensor& t : m.p)
    r.model.push_back(t.detach().clone());
  for (const at::Tensor& t : pipe.optim_parameters())
    r.masters.push_back(t.detach().clone());
  r.scaler = scaler.state_dict();
  return r;
}

bool bit_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].scalar_type() != b[i].scalar_type() ||
        !at::equal(a[i].contiguous().view(at::kByte), b[i].contiguous().view(at::kByte)))
      return false;
  return true;
}

const Config configs[] = {{"sgd", 0, false},
                          {"sgd", 1, false},
                          {"sgd", 1, true},
                          {"adam", 0, false},
                          {"adam", 1, false},
                          {"adam", 1, true},
                          {"fused-adam", 0, false, true},
                          {"fused-sgd", 0, false, true}};

std::string describe(const Config& c) {
  return c.optimizer + " staleness " + std::to_string(c.staleness) +
         (c.swap_defer ? " swap_weights+defer_grad_move" : "") +
         (c.overlap ? " overlap_backward" : "");
}

}  // namespace

TEST_CASE(
    "A checkpoint taken mid-run and resumed by fresh objects equals the run never "
    "interrupted, bit for bit") {
  constexpr iteration_t steps = 24, cut = 10;
  for (const Config& c : configs) {
    CAPTURE(describe(c));
    std::string saved;
    const Outcome plain = train(c, 0, steps, nullptr);
    const Outcome with_save = train(c, 0, steps, nullptr, cut - 1, &saved);
    const Outcome resumed = train(c, cut, steps, &saved);
    // Saving changes nothing in the run; resuming continues it exactly.
    CHECK(bit_equal(with_save.masters, plain.masters));
    CHECK(bit_equal(resumed.model, plain.model));
    CHECK(bit_equal(resumed.masters, plain.masters));
    CHECK(resumed.scaler == plain.scaler);
    // The run did skip and back off, so the scaler's part of the checkpoint mattered.
    CHECK(plain.scaler.get_double("scale") < 65536.0);
  }
}

TEST_CASE(
    "A checkpoint records the thread counts and CPU kernels, and loading under others warns") {
  HalfMlp m;
  GradScaler scaler;
  AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0));
  const int threads = at::get_num_threads();
  torch::serialize::OutputArchive out;
  pipe.save(out);
  const std::string bytes = ampactor::test::bytes_of(out);
  auto load_and_tell = [&] {
    std::ostringstream err;
    std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
    torch::serialize::InputArchive in = ampactor::test::archive_of(bytes);
    pipe.load(in);
    std::cerr.rdbuf(old);
    return err.str();
  };
  CHECK(load_and_tell().empty());  // the same setup: nothing to say
  at::set_num_threads(threads + 1);
  const std::string said = load_and_tell();
  at::set_num_threads(threads);
  CHECK(said.find("this checkpoint was written with trainer threads " + std::to_string(threads)) !=
        std::string::npos);
  CHECK(said.find("this process has trainer threads " + std::to_string(threads + 1)) !=
        std::string::npos);
}

TEST_CASE(
    "AsyncOptimizer::load refuses another parameter count, shape or masters' dtype and "
    "changes nothing") {
  HalfMlp m;
  GradScaler scaler;
  AsyncOptimizer saved_pipe(m.p, scaler);
  torch::serialize::OutputArchive out;
  saved_pipe.save(out);
  const std::string bytes = ampactor::test::bytes_of(out);

  auto refused = [&](std::vector<at::Tensor> params, AsyncOptimizerOptions o, const char* why) {
    CAPTURE(why);
    GradScaler s2;
    AsyncOptimizer pipe(std::move(params), s2, o);
    std::vector<at::Tensor> before;
    for (const at::Tensor& t : pipe.optim_parameters())
      before.push_back(t.detach().clone());
    torch::serialize::InputArchive in = ampactor::test::archive_of(bytes);
    CHECK_THROWS_WITH_AS(pipe.load(in), doctest::Contains(why), ScalerError);
    CHECK(bit_equal(std::vector<at::Tensor>(pipe.optim_parameters()), before));
  };
  refused({m.p[0], m.p[1]}, {}, "more than the 2 parameters");
  refused({m.p[0], m.p[1], m.p[2], m.p[2].detach().clone()}, {}, "fewer than the 4 parameters");
  refused({m.p[0], m.p[2], m.p[1]}, {}, "masters 1 is Float[16], this pipeline's is Float[16, 4]");
  refused(m.p, AsyncOptimizerOptions().optim_dtype(at::kDouble), "this pipeline's is Double");
  GradScaler s3;
  AsyncOptimizer pipe(m.p, s3);
  torch::serialize::OutputArchive other;
  other.write("x", c10::IValue(1.0));
  torch::serialize::InputArchive in = ampactor::test::archive_of(ampactor::test::bytes_of(other));
  CHECK_THROWS_WITH_AS(pipe.load(in), doctest::Contains("not a checkpoint written by"),
                       ScalerError);
}

TEST_CASE(
    "torch::save of a staleness-1 pipeline, torch::load into a staleness-0 one: the model's "
    "weights are brought up to date") {
  HalfMlp m;
  ampactor::test::TempDir dir;
  {
    GradScaler scaler(GradScalerOptions().init_scale(1));  // no overflow: the step is taken
    AsyncOptimizer pipe(m.p, scaler);
    auto opt = make_optimizer("sgd", pipe.optim_parameters());
    scaler.scale(m.loss(0, false)).backward();
    pipe.step(*opt, [&] { scaler.step(*opt); });
    scaler.update();
    torch::save(pipe, dir / "pipe.pt");
  }
  HalfMlp fresh;
  GradScaler scaler;
  AsyncOptimizer pipe(fresh.p, scaler, AsyncOptimizerOptions().staleness(0));
  torch::load(pipe, dir / "pipe.pt");
  std::vector<at::Tensor> cast;
  for (const at::Tensor& t : pipe.optim_parameters())
    cast.push_back(t.detach().to(at::kHalf));
  CHECK(bit_equal(fresh.p, cast));
  CHECK_FALSE(bit_equal(fresh.p, HalfMlp().p));  // the step did move them
}

TEST_CASE("GradScaler::save holds every update made before it, with steps still in flight") {
  HalfMlp m;
  GradScaler scaler(GradScalerOptions().growth_interval(2));
  AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().defer_grad_move(true));
  auto opt = make_optimizer("adam", pipe.optim_parameters());
  ampactor::test::TempDir dir;
  for (iteration_t k = 0; k < 9; ++k) {
    scaler.scale(m.loss(k, poisoned(k))).backward();
    pipe.step(*opt, [&] { scaler.step(*opt); });
    scaler.update();
  }
  torch::save(scaler, dir / "scaler.pt");  // the last step may still be running
  pipe.sync();
  const StateDict settled = scaler.state_dict();
  GradScaler other;
  torch::load(other, dir / "scaler.pt");
  CHECK(other.state_dict() == settled);
  CHECK(settled.get_double("scale") != 65536.0);
}

TEST_CASE("GradScaler::load of a bad value is refused and changes nothing") {
  GradScaler scaler(GradScalerOptions().init_scale(512));
  const StateDict before = scaler.state_dict();
  StateDict sd = before;
  sd.set("_growth_tracker", std::int64_t(-3));
  torch::serialize::InputArchive in = ampactor::test::state_dict_archive(sd);
  CHECK_THROWS_WITH_AS(scaler.load(in), doctest::Contains("_growth_tracker"), ScalerError);
  CHECK(scaler.state_dict() == before);
}
