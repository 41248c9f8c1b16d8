// What-if replays that predict found_inf from the recorded gradient size (schema 5) instead of
// taking the record as it is, and say where they cannot.
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/full.h>
#include <torch/optim/sgd.h>

#include <limits>

#include "trace_fixture.h"

namespace {

UnscaleDone report(bool inf, float scale, double grad_max, double dtype_max) {
  UnscaleDone d;
  d.k = 3;
  d.found_inf = inf;
  d.scale_used = scale;
  d.grad_max = grad_max;
  d.dtype_max = dtype_max;
  return d;
}

/// "1 predicted": found_inf and basis, printable in a failed CHECK.
std::string decided(const UnscaleDone& d, float scale) {
  const auto [found, basis] = found_inf_at(d, scale);
  return std::to_string(int(found)) + " " + basis_name(basis);
}

}  // namespace

TEST_CASE("found_inf_at: the record where it decides, the size where it does not, else unknown") {
  const auto clean = report(false, 1024, 20000, 65504);
  CHECK(decided(clean, 1024) == "0 same");
  CHECK(decided(clean, 512) == "0 bound");
  CHECK(decided(clean, 2048) == "0 predicted");  // 40000 <= 65504
  CHECK(decided(clean, 4096) == "1 predicted");  // 80000 > 65504
  // On the boundary: 32752 x 2 = 65504 is fp16's largest value, one ulp more is inf.
  CHECK(decided(report(false, 8, 32752, 65504), 16) == "0 predicted");
  CHECK(decided(report(false, 8, 32768, 65504), 16) == "1 predicted");
  const auto overflow = report(true, 1024, 30000, 65504);
  CHECK(decided(overflow, 1024) == "1 same");
  CHECK(decided(overflow, 2048) == "1 bound");
  CHECK(decided(overflow, 512) == "1 unknown");
  const auto unmeasured = report(false, 1024, 0, 0);
  CHECK(decided(unmeasured, 2048) == "0 unknown");
  CHECK(decided(unmeasured, 512) == "0 bound");
}

TEST_CASE("what-if at twice the scale predicts the overflows the recorded sizes imply") {
  // overflow_exact records fp16 sizes 20000 + 4000 k: at twice the scale, k >= 4 overflows.
  const Trace t = read_trace(golden("overflow_exact.jsonl").string());
  TraceHeader other = t.header;
  other.opts.init_scale(2 * t.header.opts.init_scale());
  const WhatIfResult w = what_if(t, other);
  REQUIRE(w.rows.size() == 12);
  std::int64_t predicted = 0, changed = 0, skips = 0;
  for (const auto& row : w.rows) {
    CAPTURE(row.k);
    skips += row.whatif_found_inf;
    const double ratio = double(row.whatif_scale) / double(row.recorded_scale);
    if (row.found_inf) {
      CHECK(row.whatif_found_inf);  // recorded overflows: kept (bound, or unknown below)
      CHECK(row.basis == (ratio > 1   ? WhatIfBasis::bound
                          : ratio < 1 ? WhatIfBasis::unknown
                                      : WhatIfBasis::same));
    } else if (ratio > 1) {
      CHECK(row.basis == WhatIfBasis::predicted);
      CHECK(row.whatif_found_inf == ((20000.0 + 4000.0 * double(row.k)) * ratio > 65504));
      ++predicted;
      changed += row.whatif_found_inf;
    } else {
      CHECK_FALSE(row.whatif_found_inf);
    }
  }
  CHECK(predicted == w.predicted);
  CHECK(changed == w.predicted_changed);
  CHECK(changed > 0);  // the what-if run overflows where the record did not
  CHECK(w.whatif.skips == skips);
  CHECK(w.whatif.skips > w.recorded.skips);
  // The CSV says it per row.
  const std::string csv = what_if_csv(w);
  CHECK(csv.rfind("k,found_inf,whatif_found_inf,basis,", 0) == 0);
  CHECK(csv.find(",predicted,") != std::string::npos);
}

TEST_CASE("what-if on a trace without sizes says where it cannot tell") {
  const Trace t = read_trace(golden("two_optimizers_lagged.jsonl").string());
  TraceHeader other = t.header;
  other.opts.init_scale(4 * t.header.opts.init_scale());
  const WhatIfResult w = what_if(t, other);
  CHECK(w.predicted == 0);
  std::int64_t unknown = 0;
  for (const auto& row : w.rows) {
    CAPTURE(row.k);
    CHECK(row.whatif_found_inf == row.found_inf);  // nothing to predict from: as recorded
    if (!row.found_inf && row.whatif_scale > row.recorded_scale) {
      CHECK(row.basis == WhatIfBasis::unknown);
      ++unknown;
    }
  }
  CHECK(unknown > 0);
  CHECK(w.uncertain >= unknown);
}

TEST_CASE("the GradScaler's optimizer reports each unscale's gradient size, per dtype") {
  auto buf = std::make_shared<TraceBuffer>();
  test::Workload w;
  std::vector<float> expected_max;
  {
    GradScaler scaler(GradScalerOptions().init_scale(4096).growth_interval(2),
                      KeeperOptions().tap(std::make_shared<TraceRecorder>(buf)));
    test::Net net;
    for (iteration_t k = 0; k < 12; ++k) {
      scaler.scale(at::ones({1}));
      const auto g = w.grads(k, float(scaler.get_scale()));
      double m = 0;  // the reference: the largest finite |gradient|
      for (const auto& t : g) {
        at::Tensor a = t.abs();
        a = at::where(at::isfinite(a), a, at::zeros_like(a));
        m = std::max(m, a.max().item<double>());
      }
      expected_max.push_back(float(m));
      net.set_grads(g);
      scaler.step(*net.opt);
      scaler.update();
    }
  }
  std::vector<UnscaleDone> done;
  for (const auto& e : buf->events)
    if (auto* d = std::get_if<UnscaleDone>(&e.msg)) done.push_back(*d);
  REQUIRE(done.size() == expected_max.size());
  for (std::size_t i = 0; i < done.size(); ++i) {
    CAPTURE(i);
    CHECK(done[i].grad_max == expected_max[i]);
    CHECK(done[i].dtype_max == double(std::numeric_limits<float>::max()));  // fp32 gradients
  }
}

TEST_CASE("StepTracker: mixed dtypes report the dtype nearest to overflow, the move measures too") {
  // fp32 gradients of 1e6 (far from float's max) and fp16 ones of 30000 (half of fp16's): fp16's.
  at::Tensor a = at::zeros({3}).set_requires_grad(true), b = at::zeros({5}, at::kHalf);
  b.set_requires_grad(true);
  torch::optim::SGD opt({a, b}, torch::optim::SGDOptions(0.1));
  a.mutable_grad() = at::full({3}, 1e6f);
  b.mutable_grad() = at::full({5}, 30000.0f).to(at::kHalf);
  StepTracker tracker(true);
  CHECK_FALSE(tracker.unscale_(opt, 0.5f));
  const GradSize size = tracker.grad_size(opt);
  CHECK(size.max == 30000.0);
  CHECK(size.dtype_max == 65504.0);
  CHECK(a.grad()[0].item<float>() == 5e5f);  // unscaled once, whole list
  CHECK(b.grad()[0].item<float>() == 15000.0f);
  // The move: fp16 model grads into fp32 masters.
  at::Tensor master = at::zeros({5}).set_requires_grad(true);
  torch::optim::SGD mopt({master}, torch::optim::SGDOptions(0.1));
  std::vector<at::Tensor> masters{master};
  StepTracker mover(true);
  mover.move_and_unscale_(mopt, {at::full({5}, -1024.0f).to(at::kHalf)}, masters, 0.25f);
  CHECK(mover.grad_size(mopt).max == 1024.0);
  CHECK(mover.grad_size(mopt).dtype_max == 65504.0);
  CHECK(master.grad()[0].item<float>() == -256.0f);
}

TEST_CASE("each peer rule's golden trace follows the thread-free rule update by update") {
  int rules = 0;
  for (const auto& g : test::golden_traces()) {
    // The per-rule scenarios (golden_peer_rule); deepspeed's has its own (a halt, a resume).
    if (g.since < 5 || std::string(g.file) == "deepspeed_rule_exact.jsonl" ||
        std::string(g.file) == "collapse_guard_exact.jsonl")
      continue;
    CAPTURE(g.file);
    const Trace t = read_trace(golden(g.file).string());
    CHECK(t.header.opts.rule() != RuleKind::torch);
    CHECK(replay_trace(t).identical);
    ScaleState ref(t.header.opts);
    ref.lazy_init();
    int backoffs = 0;
    for (const auto& e : t.events)
      if (auto* a = std::get_if<UpdateApplied>(&e.msg)) {
        CAPTURE(a->k);
        backoffs += ref.update(a->found_inf).backed_off;
        CHECK(a->scale == ref.scale());
      }
    CHECK(backoffs > 0);
    ++rules;
  }
  CHECK(rules == 6);  // megatron, apex, colossalai, keras, tf, jmp (deepspeed has its own)
}
