// Speculative steps (FusedStep::speculate): a step computed into a second buffer from the live
// state, taken by the next step_scaled when its inputs match, dropped otherwise. Taken, it must
// equal a plain step bit for bit; dropped, it must leave masters, state and step counts as they
// were (no state made for a parameter that never stepped).
#include "fused_fixture.h"

namespace {

using namespace ampactor::test;
using ampactor::optim::FusedStep;
using ampactor::optim::ScaledStep;

const std::int64_t kSizes[] = {1, 7, 33, 1013, 4099};

/// Masters of every size; the last one transposed (the exact path, never speculated).
std::vector<at::Tensor> masters(std::uint64_t seed) {
  std::vector<at::Tensor> out;
  for (std::int64_t n : kSizes)
    out.push_back(make_grad(n, 1, at::kFloat, Layout::contiguous, seed++) * 0.125);
  out.push_back(make_grad(6, 5, at::kFloat, Layout::contiguous, seed).t().contiguous().t());
  return out;
}

struct Pair {
  std::vector<at::Tensor> ref, mine, ref_w, mine_w;
  std::unique_ptr<torch::optim::Optimizer> ref_opt, mine_opt;
  FusedStep* ref_fs = nullptr;
  FusedStep* fs = nullptr;
  Pair(const OptConfig& c, at::ScalarType weight_type) {
    ref = masters(7);
    mine = clones(ref);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ref_w.push_back(ref[i].to(weight_type));
      mine_w.push_back(mine[i].to(weight_type));
    }
    ref_opt = make_optimizer(c, ref, true);
    mine_opt = make_optimizer(c, mine, true, 2);
    ref_fs = ampactor::optim::fused_step_of(*ref_opt);
    fs = ampactor::optim::fused_step_of(*mine_opt);
  }
  bool same() {
    bool ok = same_state(*ref_opt, ref, *mine_opt, mine) &&
              ref_opt->state().size() == mine_opt->state().size();
    for (std::size_t i = 0; i < ref.size(); ++i)
      ok = ok && bits_equal(ref[i], mine[i]) && bits_equal(ref_w[i], mine_w[i]);
    return ok;
  }
};

std::vector<at::Tensor> grads_for(const std::vector<at::Tensor>& ps, at::ScalarType t, int step,
                                  float scale) {
  std::vector<at::Tensor> g;
  for (std::size_t i = 0; i < ps.size(); ++i)
    g.push_back((make_grad(ps[i].size(0), ps[i].size(1), at::kFloat, Layout::contiguous,
                           500 + std::uint64_t(step) * 10 + i) *
                 (scale / 64))
                    .to(t));
  return g;
}

/// Only the parameters in [lo, hi) keep their gradient and weight (a bucket).
ScaledStep bucket(const std::vector<at::Tensor>& g, const std::vector<at::Tensor>& w,
                  std::size_t lo, std::size_t hi, float inv) {
  std::vector<at::Tensor> gb(g.size()), wb(w.size());
  for (std::size_t i = lo; i < hi; ++i)
    gb[i] = g[i], wb[i] = w[i];
  return ScaledStep().inv_scale(inv).grads(gb).weights(wb);
}

}  // namespace

TEST_CASE("speculative steps taken by step_scaled equal plain steps bit for bit") {
  for (const OptConfig& c : configs())
    for (at::ScalarType gt : {at::kHalf, at::kBFloat16, at::kFloat}) {
      CAPTURE(c.name());
      CAPTURE(c10::toString(gt));
      Pair p(c, gt == at::kFloat ? at::kFloat : gt);
      for (int step = 0; step < 4; ++step) {
        CAPTURE(step);
        const float scale = step == 2 ? 1024.0f : 65536.0f, inv = 1.0f / scale;
        const auto g = grads_for(p.ref, gt, step, scale);
        // Two buckets, the later parameters first (as backward finishes them); the transposed
        // master is in the first and is stepped by step_scaled alone.
        p.fs->speculate(bucket(g, p.mine_w, 3, p.mine.size(), inv));
        p.fs->speculate(bucket(g, p.mine_w, 0, 3, inv));
        CHECK(p.fs->speculation_pending());
        CHECK(p.ref_fs->step_scaled(ScaledStep().inv_scale(inv).grads(g).weights(p.ref_w)));
        std::vector<void*> before;
        for (const at::Tensor& m : p.mine)
          before.push_back(m.data_ptr());
        CHECK(p.fs->step_scaled(ScaledStep().inv_scale(inv).grads(g).weights(p.mine_w)));
        CHECK_FALSE(p.fs->speculation_pending());
        // Taken by swapping buffers: every fast master now lives in the other buffer; the
        // transposed one (last) was stepped in place.
        for (std::size_t i = 0; i + 1 < p.mine.size(); ++i)
          CHECK(p.mine[i].data_ptr() != before[i]);
        CHECK(p.mine.back().data_ptr() == before.back());
        CHECK(p.same());
      }
      // The second buffer: the fast masters' and their state, kept for reuse.
      CHECK(p.fs->speculation_bytes() > 0);
    }
}

TEST_CASE("a dropped speculative step leaves masters, state and step counts as they were") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    Pair p(c, at::kHalf);
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const auto g = grads_for(p.ref, at::kHalf, step, 4096.0f);
      // Step 0 drops the very first step: no state may be left for it.
      p.fs->speculate(bucket(g, p.mine_w, 0, p.mine.size(), 1.0f / 4096));
      const auto w_before = clones(p.mine_w);
      p.fs->drop_speculation();
      for (std::size_t i = 0; i < p.mine_w.size(); ++i)  // the caller's spare weights were
        p.mine_w[i].copy_(p.ref_w[i]);                   // written; put back the live ones
      CHECK(p.same());
      if (step == 0) CHECK(p.mine_opt->state().empty());
      // A real step of the same grads, as the reference takes.
      CHECK(p.ref_fs->step_scaled(ScaledStep().inv_scale(1.0f / 4096).grads(g).weights(p.ref_w)));
      CHECK(p.fs->step_scaled(ScaledStep().inv_scale(1.0f / 4096).grads(g).weights(p.mine_w)));
      CHECK(p.same());
    }
  }
}

TEST_CASE(
    "a skipped step_scaled drops the speculative steps, and changed inputs are stepped anew") {
  for (const OptConfig& c : configs()) {
    CAPTURE(c.name());
    Pair p(c, at::kHalf);
    const auto g0 = grads_for(p.ref, at::kHalf, 0, 1024.0f);
    p.fs->speculate(bucket(g0, p.mine_w, 0, p.mine.size(), 1.0f / 1024));
    CHECK_FALSE(p.fs->step_scaled(
        ScaledStep().inv_scale(1.0f / 1024).grads(g0).weights(p.mine_w).found_inf(at::ones({1}))));
    CHECK_FALSE(p.fs->speculation_pending());
    CHECK(p.mine_opt->state().empty());
    for (std::size_t i = 0; i < p.mine_w.size(); ++i)
      p.mine_w[i].copy_(p.ref_w[i]);
    CHECK(p.same());
    // Speculated, then a gradient changed in place and the second group's learning rate: those
    // parameters must step from the live state with what they are given now, the rest take
    // their speculative steps.
    auto g = grads_for(p.ref, at::kHalf, 1, 1024.0f);
    p.fs->speculate(bucket(g, p.mine_w, 0, p.mine.size(), 1.0f / 1024));
    g[1].mul_(2);
    for (auto* o : {p.ref_opt.get(), p.mine_opt.get()}) {
      auto& opts = o->param_groups()[1].options();
      opts.set_lr(opts.get_lr() * 0.5);
    }
    CHECK(p.ref_fs->step_scaled(ScaledStep().inv_scale(1.0f / 1024).grads(g).weights(p.ref_w)));
    CHECK(p.fs->step_scaled(ScaledStep().inv_scale(1.0f / 1024).grads(g).weights(p.mine_w)));
    CHECK(p.same());
  }
}
