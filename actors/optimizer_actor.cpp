#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>

#include <torch/optim/optimizer.h>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ampactor {

namespace {

/// Everything the optimizer side knows of one open iteration.
struct IterationState {
  IterationState(bool allow_fp16, std::shared_ptr<RankGroup> ranks)
      : tracker(allow_fp16, std::move(ranks)) {}
  StepTracker tracker;
  std::vector<StepResult> steps;
  std::vector<OverflowTensor> overflow;      // the gradients that held inf or NaN, named
  std::vector<std::int32_t> overflow_ranks;  // data parallel: the ranks that found it
  std::int32_t unscales = 0;
  bool failed = false;
  errc code = errc::step_failed;
  std::string what;
  std::int32_t more_failures = 0;  // after the first
  std::int32_t cancelled = 0;
};

struct optimizer_state {
  // Not an aggregate: in C++20 (LibTorch 2.x) an aggregate whose first member is a typed handle
  // would look constructible from the actor pointer to CAF, which then fails to compile.
  optimizer_state() = default;
  scale_keeper_actor keeper;
  GradScalerOptions opts;
  std::shared_ptr<const std::atomic<std::uint64_t>> cancel_epoch;
  std::shared_ptr<ParameterNames> names;
  std::map<iteration_t, IterationState> open;
  struct Subscriber {
    trainer_actor who;
    bool steps;  // also every StepResult
  };
  std::vector<Subscriber> subscribers;
  static inline const char* name = "ampactor.optimizer";
};

using optimizer_ptr = optimizer_actor::stateful_pointer<optimizer_state>;

IterationState& open_iteration(optimizer_state& st, iteration_t k) {
  auto it = st.open.find(k);
  if (it == st.open.end())
    it = st.open.emplace(k, IterationState(st.opts.allow_fp16_grads(), st.opts.ranks())).first;
  return it->second;
}

/// The JobContext of one job: reports go out as messages from the optimizer actor.
class Job final : public JobContext {
 public:
  Job(optimizer_ptr self, const StepJob& job, IterationState& it)
      : JobContext(job.k, job.scale, job.guard, self->state.opts.enabled(), job.permit, self->id(),
                   it.tracker),
        self_(self),
        it_(it) {}

 private:
  void report_unscale(optimizer_id opt, bool found_inf, bool local_found_inf, const GradSize& size,
                      std::vector<std::int32_t> found_by) override {
    ++it_.unscales;
    it_.overflow_ranks.insert(it_.overflow_ranks.end(), found_by.begin(), found_by.end());
    self_->send(self_->state.keeper,
                UnscaleDone{iteration(), opt, found_inf, scale(), size.max, size.dtype_max,
                            local_found_inf, std::move(named_), std::move(found_by)});
    named_.clear();
  }
  void found_overflow(const torch::optim::Optimizer& opt) override {
    if (!enabled()) return;
    try {
      static const ParameterNames unnamed;
      const auto& names = self_->state.names;
      named_ = overflow_of(it_.tracker, opt, scale(), names ? *names : unnamed);
      it_.overflow.insert(it_.overflow.end(), named_.begin(), named_.end());
    } catch (const std::exception& e) {
      // The step's outcome stands; only the attribution is lost, and said so.
      std::cerr << "ampactor: iteration " << iteration()
                << ": which gradients overflowed is unknown: " << e.what() << "\n";
    }
  }
  void report_step(const StepResult& r) override {
    it_.steps.push_back(r);
    for (auto& s : self_->state.subscribers)
      if (s.steps) caf::anon_send(s.who, r);
  }
  optimizer_ptr self_;
  IterationState& it_;
  std::vector<OverflowTensor> named_;  // found_overflow's, for the next UnscaleDone
};

/// One entry per subscriber: subscribing again only changes whether it hears every StepResult.
void subscribe(optimizer_ptr self, trainer_actor who, bool steps) {
  if (!who) return;
  for (auto& s : self->state.subscribers)
    if (s.who == who) {
      s.steps = steps;
      return;
    }
  self->state.subscribers.push_back({std::move(who), steps});
}

void record_failure(IterationState& it, errc code, std::string what) {
  // The first failure is the one reported (its code); later ones of the same iteration are named
  // in its text, so that none is lost in silence (a few of them: their number beyond that).
  constexpr std::int32_t kNamed = 8;
  if (it.failed) {
    ++it.more_failures;
    if (it.more_failures <= kNamed)
      it.what += "\n  also failed in this iteration: " + what;
    else if (it.more_failures == kNamed + 1)
      it.what += "\n  (and more failures in this iteration)";
    return;
  }
  it.failed = true;
  it.code = code;
  it.what = std::move(what);
}

/// The StepJob handler: runs job.fn in a JobContext of its iteration.
caf::result<JobDone> run_job(optimizer_ptr self, StepJob& job) {
  auto& st = self->state;
  IterationState& it = open_iteration(st, job.k);
  // Unscales the trainer counted in advance (the job may make that many). Those it does
  // not make the keeper hears of at once, or the update waiting for them never applies;
  // a disabled scaler reports none and owes none.
  const std::int32_t owed = st.opts.enabled() ? job.permit.counted() : 0;
  auto release_counted = [&](std::int32_t made) {
    if (made < owed) self->send(st.keeper, IterationClosed{job.k, it.unscales, true});
  };
  if (st.cancel_epoch && job.epoch < st.cancel_epoch->load()) {
    ++it.cancelled;
    release_counted(0);
    return make_error(errc::cancelled, texts::cancelled);
  }
  // No exception leaves the handler: a failing job fails its iteration, not the actor.
  errc code = errc::step_failed;
  std::string what;
  Job ctx(self, job, it);
  try {
    if (job.fn) job.fn();
    if (ctx.unscales() < owed)
      throw ScalerError(errc::protocol_misuse, "a step job counted to make " +
                                                   std::to_string(owed) + " unscale(s) made " +
                                                   std::to_string(ctx.unscales()));
    return JobDone{job.k, ctx.unscales()};
  } catch (const ScalerError& e) {
    code = e.code();
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception in a step job";
  }
  record_failure(it, code, what);
  // Data parallel: the other ranks' next collective fails; this lets them name this rank
  // and its reason (a collective's own failure names another rank already).
  if (self->state.opts.ranks() && code != errc::rank_failed)
    self->state.opts.ranks()->fail("its step job in iteration " + std::to_string(job.k) +
                                   " threw: " + what);
  release_counted(ctx.unscales());
  return make_error(code, what);
}

/// The CloseIteration handler: reports the iteration's end to the keeper and the subscribers.
void close_iteration(optimizer_ptr self, const CloseIteration& c) {
  auto& st = self->state;
  IterationState it(st.opts.allow_fp16_grads(), st.opts.ranks());
  if (auto found = st.open.find(c.k); found != st.open.end()) {
    it = std::move(found->second);
    st.open.erase(found);
  }
  if (c.report_unscales && c.inf_checks_required && st.opts.enabled() && it.unscales == 0 &&
      !it.failed && it.cancelled == 0)
    record_failure(it, errc::no_inf_checks_before_update, texts::no_inf_checks_before_update);
  const bool abandoned = it.failed || it.cancelled > 0;
  if (c.report_unscales) self->send(st.keeper, IterationClosed{c.k, it.unscales, abandoned});
  IterationDone d{c.k, std::move(it.steps), it.failed, it.code, it.what, it.cancelled, {}};
  sort_overflow(it.overflow);  // several optimizers: by parameter index, then name
  d.overflow = std::move(it.overflow);
  // Each optimizer's unscale names its ranks: once each, ascending.
  auto& ranks = it.overflow_ranks;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  d.overflow_ranks = std::move(ranks);
  for (auto& s : st.subscribers)
    caf::anon_send(s.who, d);
}

void drop_subscriber(optimizer_ptr self, const trainer_actor& who) {
  auto& subs = self->state.subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const auto& s) { return s.who == who; }),
             subs.end());
}

optimizer_actor::behavior_type optimizer(optimizer_ptr self, scale_keeper_actor keeper,
                                         GradScalerOptions opts,
                                         std::shared_ptr<const std::atomic<std::uint64_t>> epoch,
                                         std::shared_ptr<ParameterNames> names) {
  self->state.keeper = std::move(keeper);
  self->state.opts = opts;
  self->state.cancel_epoch = std::move(epoch);
  self->state.names = std::move(names);
  return {
      [=](StepJob& job) -> caf::result<JobDone> { return run_job(self, job); },
      [=](CloseIteration c) { close_iteration(self, c); },
      [=](subscribe_atom, trainer_actor who) { subscribe(self, std::move(who), /*steps=*/true); },
      [=](subscribe_atom, trainer_actor who, bool steps) {
        subscribe(self, std::move(who), steps);
      },
      [=](unsubscribe_atom, trainer_actor who) { drop_subscriber(self, who); },
  };
}

}  // namespace

optimizer_actor spawn_optimizer_actor(caf::actor_system& sys, scale_keeper_actor keeper,
                                      const GradScalerOptions& opts,
                                      OptimizerActorOptions options) {
  if (options.detached())
    return sys.spawn<caf::detached>(optimizer, std::move(keeper), opts,
                                    std::move(options.cancel_epoch()), options.names());
  return sys.spawn(optimizer, std::move(keeper), opts, std::move(options.cancel_epoch()),
                   options.names());
}

void subscribe(const ScalerActors& actors, const trainer_actor& who) {
  caf::anon_send(actors.optimizer, subscribe_atom::value, who);
  caf::anon_send(actors.keeper, subscribe_atom::value, who);
}

void unsubscribe(const ScalerActors& actors, const trainer_actor& who) {
  caf::anon_send(actors.optimizer, unsubscribe_atom::value, who);
  caf::anon_send(actors.keeper, unsubscribe_atom::value, who);
}

ScalerActors spawn_scaler_actors(caf::actor_system& sys, const GradScalerOptions& opts,
                                 ScalePolicy policy, OptimizerActorOptions options) {
  ScalerActors a;
  a.keeper =
      spawn_scale_keeper(sys, opts, KeeperOptions().policy(policy).detached(options.detached()));
  a.optimizer = spawn_optimizer_actor(sys, a.keeper, opts, std::move(options));
  return a;
}

}  // namespace ampactor
