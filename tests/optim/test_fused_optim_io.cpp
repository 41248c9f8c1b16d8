// The fused optimizers' skip, checkpoints (torch::optim's own format, both ways), plain step(),
// parameters without gradients, and refusals that change nothing.
#include <ampactor/core/errors.h>

#include <torch/serialize.h>

#include <sstream>

#include "fused_fixture.h"

namespace {

using namespace ampactor::test;
using ampactor::errc;
using ampactor::ScalerError;
using ampactor::optim::ScaledStep;

std::vector<at::Tensor> fp32_params(std::uint64_t seed) {
  std::vector<at::Tensor> ps;
  for (std::int64_t n : {5, 40, 1029})
    ps.push_back(make_grad(n, 1, at::kFloat, Layout::contiguous, seed++));
  return ps;
}

void set_grads(const std::vector<at::Tensor>& ps, std::uint64_t seed) {
  for (const at::Tensor& p : ps)
    p.mutable_grad() = make_grad(p.size(0), 1, at::kFloat, Layout::contiguous, seed++) * 0.01;
}

ampactor::optim::FusedStep& fused(torch::optim::Optimizer& o) {
  return *ampactor::optim::fused_step_of(o);
}

/// Runs `fn` and requires a ScalerError with `code` whose text holds `text`.
template <typename F>
void refused(F&& fn, errc code, const std::string& text) {
  try {
    fn();
    FAIL("not refused: " << text);
  } catch (const ScalerError& e) {
    CHECK(e.code() == code);
    const std::string what = e.what();
    CHECK_MESSAGE(what.find(text) != std::string::npos, what);
  }
}

}  // namespace

TEST_CASE("a found_inf step changes no master, moment, step count or weight") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    std::vector<at::Tensor> ps = fp32_params(1), weights;
    for (const at::Tensor& p : ps)
      weights.push_back(p.to(at::kHalf));
    auto opt = make_optimizer(c, ps, true);
    set_grads(ps, 10);
    REQUIRE(fused(*opt).step_scaled(ScaledStep().found_inf(zero_flag())));  // state exists
    for (std::size_t i = 0; i < ps.size(); ++i)
      weights[i].copy_(ps[i]);
    const auto before = clones(ps), weights_before = clones(weights);
    std::vector<std::vector<at::Tensor>> state_before;
    for (const at::Tensor& p : ps)
      state_before.push_back(clones(state_of(*opt, p)));
    set_grads(ps, 20);
    const at::Tensor inf = at::ones({}, at::kFloat);
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : ps)
      grads.push_back(p.grad().to(at::kHalf));
    CHECK_FALSE(fused(*opt).step_scaled(
        ScaledStep().inv_scale(0.5f).found_inf(inf).grads(grads).weights(weights)));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      CHECK(bits_equal(ps[i], before[i]));
      CHECK(bits_equal(weights[i], weights_before[i]));
      const auto st = state_of(*opt, ps[i]);
      REQUIRE(st.size() == state_before[i].size());
      for (std::size_t k = 0; k < st.size(); ++k)
        CHECK(bits_equal(st[k], state_before[i][k]));  // the step count is the last one
    }
  }
}

TEST_CASE("plain step() equals torch::optim's, closure included") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    std::vector<at::Tensor> a = fp32_params(3), b = clones(a);
    auto t = make_optimizer(c, a, false), f = make_optimizer(c, b, true);
    for (int s = 0; s < 3; ++s) {
      set_grads(a, 30 + s * 5), set_grads(b, 30 + s * 5);
      int calls = 0;
      const at::Tensor loss = f->step([&] {
        ++calls;
        CHECK(at::GradMode::is_enabled());  // as torch's: the closure runs with grad on
        return at::full({}, 2.5);
      });
      CHECK(calls == 1);
      CHECK(loss.item<double>() == 2.5);
      t->step();
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(agree(a[i], b[i], false, allowed_ulps(c, 3)));
    CHECK(same_state(*t, a, *f, b, false, allowed_ulps(c, 3)));
  }
}

TEST_CASE("a torch::optim checkpoint loads into the fused optimizer and back, same trajectory") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    std::vector<at::Tensor> a = fp32_params(5), b = clones(a);
    auto t = make_optimizer(c, a, false);
    for (int s = 0; s < 2; ++s)
      set_grads(a, 50 + s * 5), t->step();
    // torch -> fused
    std::stringstream buf;
    torch::serialize::OutputArchive out;
    t->save(out);
    out.save_to(buf);
    for (std::size_t i = 0; i < a.size(); ++i)
      b[i].detach().copy_(a[i]);
    auto f = make_optimizer(c, b, true);
    torch::serialize::InputArchive in;
    in.load_from(buf);
    f->load(in);
    CHECK(same_state(*t, a, *f, b));
    for (int s = 2; s < 4; ++s) {
      set_grads(a, 50 + s * 5), set_grads(b, 50 + s * 5);
      t->step(), f->step();
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(bits_equal(a[i], b[i]));
    // fused -> torch
    std::stringstream buf2;
    torch::serialize::OutputArchive out2;
    f->save(out2);
    out2.save_to(buf2);
    std::vector<at::Tensor> d = clones(b);
    auto t2 = make_optimizer(c, d, false);
    torch::serialize::InputArchive in2;
    in2.load_from(buf2);
    t2->load(in2);
    CHECK(same_state(*f, b, *t2, d));
    set_grads(b, 90), set_grads(d, 90);
    f->step(), t2->step();
    for (std::size_t i = 0; i < b.size(); ++i)
      CHECK(bits_equal(b[i], d[i]));
  }
}

TEST_CASE("a parameter without a gradient is left alone, and its weight gets the master") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    std::vector<at::Tensor> ps = fp32_params(7), weights;
    for (const at::Tensor& p : ps)
      weights.push_back(at::zeros_like(p, at::kBFloat16));
    auto opt = make_optimizer(c, ps, true);
    const auto before = clones(ps);
    std::vector<at::Tensor> grads = {at::Tensor(), at::ones_like(ps[1]), at::Tensor()};
    CHECK(fused(*opt).step_scaled(ScaledStep().grads(grads).weights(weights)));
    CHECK(bits_equal(ps[0], before[0]));
    CHECK(bits_equal(ps[2], before[2]));
    CHECK_FALSE(bits_equal(ps[1], before[1]));
    CHECK(state_of(*opt, ps[0]).empty());
    for (std::size_t i = 0; i < ps.size(); ++i)
      CHECK(bits_equal(weights[i], ps[i].to(at::kBFloat16)));
  }
}

TEST_CASE("bad input to a fused step is refused by name and changes nothing") {
  const OptConfig c = configs()[2];  // adam with amsgrad
  std::vector<at::Tensor> ps = fp32_params(9);
  auto opt = make_optimizer(c, ps, true);
  set_grads(ps, 90);
  const auto before = clones(ps);
  auto& f = fused(*opt);
  std::vector<at::Tensor> g = {ps[0].grad(), ps[1].grad(), ps[2].grad()};
  auto with = [&](std::size_t i, at::Tensor t) {
    auto v = g;
    v[i] = std::move(t);
    return v;
  };
  refused(
      [&] {
        f.step_scaled(ScaledStep().grads({g[0], g[1]}));
      },
      errc::bad_parameters, "2 gradients for 3 parameters");
  refused([&] { f.step_scaled(ScaledStep().grads(with(1, g[1].to(at::kInt)))); },
          errc::invalid_gradients, "gradient 1 must be a dense CPU fp32, fp16 or bf16");
  refused([&] { f.step_scaled(ScaledStep().grads(with(2, at::ones({3})))); },
          errc::invalid_gradients, "gradient 2 does not have its parameter's shape");
  refused([&] { f.step_scaled(ScaledStep().grads(with(0, g[0].to(at::kDouble)))); },
          errc::invalid_gradients, "gradient 0");
  refused(
      [&] {
        f.step_scaled(ScaledStep().weights({ps[0].to(at::kHalf), ps[1], at::ones({2})}));
      },
      errc::bad_parameters, "weight 2 does not have its parameter's shape");
  refused(
      [&] {
        f.step_scaled(ScaledStep().weights({ps[0].detach(), ps[1], ps[2]}));
      },
      errc::bad_parameters, "weight 0 shares memory with its parameter");
  // An expanded weight (stride 0), for a master of each path: refused before anything is
  // stepped (copy_ into it would throw only after the master was).
  refused(
      [&] {
        f.step_scaled(ScaledStep().weights(
            {ps[0].to(at::kHalf), at::ones({1}, at::kHalf).expand(ps[1].sizes()), ps[2]}));
      },
      errc::bad_parameters, "weight 1 has elements that share memory");
  refused(
      [&] {
        f.speculate(ScaledStep().grads(g).weights(
            {at::ones({1}).expand(ps[0].sizes()), at::Tensor(), at::Tensor()}));
      },
      errc::bad_parameters, "weight 0 has elements that share memory");
  refused([&] { f.step_scaled(ScaledStep().found_inf(at::zeros({2}))); }, errc::bad_parameters,
          "found_inf must be a 1-element fp32 CPU tensor");
  refused([&] { ScaledStep().inv_scale(std::numeric_limits<float>::infinity()); }, errc::bad_option,
          "inv_scale must be finite and > 0");
  refused([&] { ScaledStep().inv_scale(0.0f); }, errc::bad_option, "inv_scale");
  refused([&] { ampactor::optim::FusedOptions().threads(-1); }, errc::bad_option,
          "threads must be >= 0");
  for (std::size_t i = 0; i < ps.size(); ++i)
    CHECK(bits_equal(ps[i], before[i]));
  CHECK(opt->state().empty());
  // Masters that are not fp32 (or fp64): the model's fp16 parameters, say.
  std::vector<at::Tensor> half = {at::ones({4}, at::kHalf)};
  half[0].mutable_grad() = at::ones({4}, at::kHalf);
  ampactor::optim::FusedAdamW w(half);
  refused([&] { w.step(); }, errc::bad_parameters, "fused optimizers step fp32 masters");
  CHECK(w.state().empty());
}

TEST_CASE("fp64 masters take the exact path and equal torch::optim") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    std::vector<at::Tensor> a, b;
    for (const at::Tensor& p : fp32_params(13))
      a.push_back(p.to(at::kDouble)), b.push_back(p.to(at::kDouble));
    auto t = make_optimizer(c, a, false), f = make_optimizer(c, b, true);
    for (int s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        const at::Tensor g = at::randn_like(a[i]);
        a[i].mutable_grad() = g.clone(), b[i].mutable_grad() = g.clone();
      }
      t->step(), f->step();
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      CHECK(bits_equal(a[i], b[i]));
    CHECK(same_state(*t, a, *f, b));
  }
}
