// The scenarios behind the golden traces in tests/traces/: keeper cores driven input by input
// (KeeperRig) by a trainer and one or two optimizers, so each trace is the same byte for byte on
// every run. ampactor-make-golden-traces writes them; the tests check that the files replay
// identically and that regenerating them changes nothing. tests/traces/v1/ keeps the same
// scenarios as schema version 1 wrote them, which must still read and replay.
#pragma once

#include <ampactor/trace/rig.h>
#include <ampactor/trace/trace.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ampactor::test {

/// A keeper core whose trace goes to `sink` when the rig is done; peers "trainer", "opt1" and
/// "opt2" (named trainer1, optimizer1, optimizer2 in the trace by order of appearance).
struct GoldenRig {
  KeeperRig rig;
  std::shared_ptr<TraceSink> sink;
  TraceHeader header;
  std::string trainer = "trainer", opt1 = "opt1", opt2 = "opt2";
  std::map<iteration_t, float> scale_of;  // ScaleReply{k} as the trainer received it

  GoldenRig(const GradScalerOptions& o, ScalePolicy p, std::shared_ptr<TraceSink> s)
      : rig(o, p), sink(std::move(s)), header{o, p} {}
  /// The scenario is over: its trace goes to the sink.
  ~GoldenRig() {
    sink->header(header);
    for (const auto& e : rig.events())
      sink->event(e);
    sink->finish();
  }
  void send(const std::string& from, KeeperInput m) {
    for (const auto& o : rig.send(from, std::move(m)))
      if (auto* r = std::get_if<KeeperReply>(&o))
        if (auto* s = std::get_if<ScaleReply>(&r->msg)) scale_of[s->k] = s->scale;
  }
  void anon(KeeperInput m) { send(trace_anonymous, std::move(m)); }
  /// One optimizer's report for iteration k, with the scale the trainer was given for k, the
  /// gradients' size when measured (dtype_max 0: not), and which gradients (and ranks) held the
  /// inf or NaN (version 7).
  void report(const std::string& opt, iteration_t k, optimizer_id id, bool inf, double grad_max = 0,
              double dtype_max = 0, std::vector<OverflowTensor> overflow = {},
              std::vector<std::int32_t> found_by = {}) {
    send(opt, UnscaleDone{k, id, inf, scale_of.at(k), grad_max, dtype_max, inf, std::move(overflow),
                          std::move(found_by)});
  }
};

/// exact policy, one optimizer, overflows at 4, 5 and 9; the trainer subscribes, sends
/// UpdateScale{k} and ScaleRequest{k+1} before the optimizer reports k (so the request waits), and
/// asks up_to_date and immediate getters mid-run. The reports carry fp16 gradient sizes (version
/// 5): 20000 + 4000 k, so a doubled scale would overflow from k = 4 on; and which gradients held
/// the inf or NaN (version 7): fc1.weight inf at 4, 5 and 9, fc2.bias NaN at 5.
inline std::vector<OverflowTensor> golden_overflow_at(iteration_t k) {
  std::vector<OverflowTensor> out;
  if (k == 4 || k == 5 || k == 9) out.push_back({"fc1.weight", 0, true, false, 0.5});
  if (k == 5) out.push_back({"fc2.bias", 3, false, true, 0.25});
  return out;
}
inline void golden_overflow_exact(std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions().init_scale(1024).growth_interval(3);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.anon(Subscribe{r.rig.peer(r.trainer)});
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 12; ++k) {
    r.anon(UpdateScale{k, 1});
    if (k == 6) r.send(r.trainer, GetParams{true});
    r.send(r.trainer, ScaleRequest{k + 1});
    if (k == 7) r.send(r.trainer, GetParams{false});
    r.report(r.opt1, k, 7001, k == 4 || k == 5 || k == 9, 20000.0 + 4000.0 * double(k), 65504,
             golden_overflow_at(k));
  }
  r.send(r.trainer, GetStateDict{});
}

/// lagged policy, two optimizers reporting in alternating order, some before the update: the
/// overflow of 3 and 4 is one event (one backoff), 8 another.
inline void golden_two_optimizers_lagged(std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions().init_scale(512).growth_interval(2);
  GoldenRig r(o, ScalePolicy::lagged, std::move(sink));
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 12; ++k) {
    const bool inf1 = k == 3;
    const bool inf2 = k == 3 || k == 4 || k == 8;
    if (k % 3 == 0) r.report(r.opt2, k, 42, inf2);  // before the update
    r.anon(UpdateScale{k, 2});
    r.send(r.trainer, ScaleRequest{k + 1});  // answered at once: one iteration late
    if (k % 2 == 0) {
      r.report(r.opt1, k, 41, inf1);
      if (k % 3 != 0) r.report(r.opt2, k, 42, inf2);
    } else {
      if (k % 3 != 0) r.report(r.opt2, k, 42, inf2);
      r.report(r.opt1, k, 41, inf1);
    }
    if (k == 5) r.send(r.trainer, GetParams{true});
  }
  r.send(r.trainer, GetParams{true});
}

/// exact policy: setters (one refused) and up_to_date getters mid-run, a state_dict saved and
/// loaded back, an update with a new scale, an iteration whose unscale count the optimizer
/// reports (IterationClosed), an abandoned one, and a late report.
inline void golden_setters_state(std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions().init_scale(256).growth_interval(4);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.send(r.trainer, ScaleRequest{0});
  StateDictMsg saved;
  for (iteration_t k = 0; k < 14; ++k) {
    if (k == 3) r.anon(SetGrowthFactor{3.0});
    if (k == 5) r.send(r.trainer, SetGrowthInterval{2});
    if (k == 6) r.send(r.trainer, SetBackoffFactor{1.5});  // refused
    if (k == 4 || k == 7) r.send(r.trainer, GetParams{true});
    if (k == 9) r.send(r.trainer, LoadStateDict{saved});
    if (k == 10) {
      r.anon(SetScale{k, 100.0});
    } else if (k == 11 || k == 12) {
      r.anon(UpdateWhenClosed{k});
      if (k == 11) r.report(r.opt1, k, 9, false);
      r.send(r.opt1, IterationClosed{k, k == 11 ? 1 : 0, k == 12});
    } else {
      r.report(r.opt1, k, 9, k == 2 || k == 13);
      r.anon(UpdateScale{k, 1});
    }
    if (k == 8) {
      r.send(r.trainer, GetStateDict{});
      saved.empty = false;
      saved.scale = 300;
      saved.growth_factor = 2;
      saved.backoff_factor = 0.25;
      saved.growth_interval = 3;
      saved.growth_tracker = 1;
    }
    if (k == 12) r.report(r.opt1, 10, 9, true);  // late: update 10 is applied, ignored
    r.send(r.trainer, ScaleRequest{k + 1});
  }
  r.send(r.trainer, GetParams{true});
}

/// exact policy, the deepspeed rule (version 6; versions 4 and 5 recorded DeepSpeed's old growth
/// count, kept in v4/ and v5/): hysteresis 2 absorbs the first overflow of a run and not the
/// next, the third clean step after an overflow grows (window 2) and refills it; at the minimum
/// the update raises (halted), the next ScaleRequest is refused, and update(new_scale) resumes
/// the run.
inline void golden_deepspeed_rule(std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions::deepspeed().init_scale(4).growth_interval(2);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 13; ++k) {
    if (k == 9) {
      r.anon(SetScale{k, 8.0});
    } else {
      r.report(r.opt1, k, 3, k == 0 || k == 1 || (k >= 5 && k <= 8));
      r.anon(UpdateScale{k, 1});
    }
    r.send(r.trainer, ScaleRequest{k + 1});
  }
  r.send(r.trainer, GetStateDict{});
}

/// exact policy, one peer rule from its preset (version 5), at a small scale with growth every 2
/// clean steps: single overflows (3, 8), runs of two and three (5-6, 11-13) so that hysteresis
/// shows, and clean stretches that grow up to any maximum; fp16 gradient sizes on every report.
inline void golden_peer_rule(RuleKind kind, std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions::preset(kind).init_scale(256).growth_interval(2);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 18; ++k) {
    const bool inf = k == 3 || k == 5 || k == 6 || k == 8 || (k >= 11 && k <= 13);
    r.report(r.opt1, k, 5, inf, 100.0 + 10.0 * double(k), 65504);
    r.anon(UpdateScale{k, 1});
    r.send(r.trainer, ScaleRequest{k + 1});
  }
  r.send(r.trainer, GetStateDict{});
}

/// exact policy with the scale-collapse guard set (version 7: the header's guard, ScaleReply's and
/// UpdateApplied's backoffs_in_row and collapsing), as rank 1 of a data-parallel run recorded it:
/// overflows at 2 to 6 (its own check found them, in out.weight), so the third backoff in a row (k
/// = 4) trips the guard and the scale falls below 0.5 at 6; it stays collapsing while below, until
/// update(new_scale) at 9 resets it.
inline void golden_collapse_guard(std::shared_ptr<TraceSink> sink) {
  const auto o =
      GradScalerOptions().init_scale(8).growth_interval(100).collapse_backoffs(3).collapse_below(
          0.5);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 11; ++k) {
    const bool inf = k >= 2 && k <= 6;
    if (k == 9) {
      r.anon(SetScale{k, 1024.0});
    } else {
      r.report(r.opt1, k, 3, inf, inf ? 0.0 : 1000.0, 65504,
               inf ? std::vector<OverflowTensor>{{"out.weight", 4, true, false, 12.5}}
                   : std::vector<OverflowTensor>{},
               inf ? std::vector<std::int32_t>{1} : std::vector<std::int32_t>{});
      r.anon(UpdateScale{k, 1});
    }
    r.send(r.trainer, ScaleRequest{k + 1});
  }
}

struct Golden {
  const char* file;
  std::function<void(std::shared_ptr<TraceSink>)> make;
  int since = 1;  // the first schema version with this scenario (older ones are kept in vN/)
};

inline std::vector<Golden> golden_traces() {
  return {
      {"overflow_exact.jsonl", golden_overflow_exact},
      {"two_optimizers_lagged.jsonl", golden_two_optimizers_lagged},
      {"setters_state_exact.jsonl", golden_setters_state},
      {"deepspeed_rule_exact.jsonl", golden_deepspeed_rule, 6},
      {"megatron_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::megatron, s); }, 5},
      {"apex_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::apex, s); }, 5},
      {"colossalai_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::colossalai, s); }, 5},
      {"keras_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::keras, s); }, 5},
      {"tf_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::tf, s); }, 5},
      {"jmp_rule_exact.jsonl", [](auto s) { golden_peer_rule(RuleKind::jmp, s); }, 5},
      {"collapse_guard_exact.jsonl", golden_collapse_guard, 7}};
}

}  // namespace ampactor::test
