// The scenarios behind the golden traces in tests/traces/: keepers driven message by message under
// CAF's deterministic scheduler by a trainer and one or two optimizers (separate actors), so each
// trace is the same byte for byte on every run. ampactor-make-golden-traces writes them; the tests
// check that the files replay identically and that regenerating them changes nothing.
#pragma once

#include <ampactor/actors/scale_keeper.h>
#include <ampactor/actors/trace.h>
#include <ampactor/messages/registry.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ampactor::test {

struct GoldenConfig : caf::actor_system_config {
  GoldenConfig() {
    register_messages(*this);
    set("scheduler.policy", caf::atom("testing"));
  }
};

/// A keeper recording into `sink`, a trainer and two optimizer actors.
struct GoldenRig {
  GoldenConfig cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor trainer{sys};
  caf::scoped_actor opt1{sys};
  caf::scoped_actor opt2{sys};
  scale_keeper_actor keeper;
  std::map<iteration_t, float> scale_of;  // ScaleReply{k} as the trainer received it

  GoldenRig(const GradScalerOptions& o, ScalePolicy p, std::shared_ptr<TraceSink> sink) {
    keeper = spawn_scale_keeper(sys, o, p, false, std::move(sink));
    sched.run();
  }
  ~GoldenRig() {
    caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    sched.run();
  }
  template <class M>
  void send(caf::scoped_actor& from, M m) {
    from->send(keeper, std::move(m));
    sched.run();
    collect();
  }
  template <class... Ms>
  void anon(Ms... m) {
    caf::anon_send(keeper, std::move(m)...);
    sched.run();
    collect();
  }
  /// Reads the trainer's mailbox: ScaleReply values are kept, the rest dropped.
  void collect() {
    while (!trainer->mailbox().empty())
      trainer->receive([&](const ScaleReply& r) { scale_of[r.k] = r.scale; }, [](caf::error&) {},
                       caf::others >> [](caf::message_view&) -> caf::result<caf::message> {
                         return caf::message{};
                       });
  }
  /// One optimizer's report for iteration k, with the scale the trainer was given for k.
  void report(caf::scoped_actor& opt, iteration_t k, optimizer_id id, bool inf) {
    send(opt, UnscaleDone{k, id, inf, scale_of.at(k)});
  }
};

/// exact policy, one optimizer, overflows at 4, 5 and 9; the trainer subscribes, sends
/// UpdateScale{k} and ScaleRequest{k+1} before the optimizer reports k (so the request waits), and
/// asks up_to_date and immediate getters mid-run.
inline void golden_overflow_exact(std::shared_ptr<TraceSink> sink) {
  const auto o = GradScalerOptions().init_scale(1024).growth_interval(3);
  GoldenRig r(o, ScalePolicy::exact, std::move(sink));
  r.anon(subscribe_atom::value, caf::actor{r.trainer});
  r.send(r.trainer, ScaleRequest{0});
  for (iteration_t k = 0; k < 12; ++k) {
    r.anon(UpdateScale{k, 1, false, 0});
    if (k == 6) r.send(r.trainer, GetParams{k, true});
    r.send(r.trainer, ScaleRequest{k + 1});
    if (k == 7) r.send(r.trainer, GetParams{k, false});
    r.report(r.opt1, k, 7001, k == 4 || k == 5 || k == 9);
  }
  r.send(r.trainer, GetStateDict{12});
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
    r.anon(UpdateScale{k, 2, false, 0});
    r.send(r.trainer, ScaleRequest{k + 1});  // answered at once: one iteration late
    if (k % 2 == 0) {
      r.report(r.opt1, k, 41, inf1);
      if (k % 3 != 0) r.report(r.opt2, k, 42, inf2);
    } else {
      if (k % 3 != 0) r.report(r.opt2, k, 42, inf2);
      r.report(r.opt1, k, 41, inf1);
    }
    if (k == 5) r.send(r.trainer, GetParams{k, true});
  }
  r.send(r.trainer, GetParams{12, true});
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
    if (k == 3) r.anon(SetParam{k, Param::growth_factor, 3.0});
    if (k == 5) r.send(r.trainer, SetParam{k, Param::growth_interval, 2.0});
    if (k == 6) r.send(r.trainer, SetParam{k, Param::backoff_factor, 1.5});  // refused
    if (k == 4 || k == 7) r.send(r.trainer, GetParams{k, true});
    if (k == 9) r.send(r.trainer, LoadStateDict{k, saved});
    if (k == 10) {
      r.anon(UpdateScale{k, 0, true, 100.0});
    } else if (k == 11 || k == 12) {
      r.anon(UpdateScale{k, unscales_from_optimizer, false, 0});
      if (k == 11) r.report(r.opt1, k, 9, false);
      r.send(r.opt1, IterationClosed{k, k == 11 ? 1 : 0, k == 12});
    } else {
      r.report(r.opt1, k, 9, k == 2 || k == 13);
      r.anon(UpdateScale{k, 1, false, 0});
    }
    if (k == 8) {
      r.send(r.trainer, GetStateDict{k});
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
  r.send(r.trainer, GetParams{14, true});
}

struct Golden {
  const char* file;
  std::function<void(std::shared_ptr<TraceSink>)> make;
};

inline std::vector<Golden> golden_traces() {
  return {{"overflow_exact.jsonl", golden_overflow_exact},
          {"two_optimizers_lagged.jsonl", golden_two_optimizers_lagged},
          {"setters_state_exact.jsonl", golden_setters_state}};
}

}  // namespace ampactor::test
