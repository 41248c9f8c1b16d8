#include "internal/grad_scaler_impl.h"

#include <ampactor/messages/config.h>
#include <ampactor/scaler/ranks.h>

#include <caf/actor_system.hpp>
#include <caf/logger.hpp>
#include <caf/others.hpp>
#include <caf/send.hpp>

#include <cstdlib>
#include <iostream>

namespace ampactor {
namespace internal {

/// An actor system of the scaler's own, with its config (which must outlive it).
class SystemHolder {
 public:
  // The keeper and the optimizer have threads of their own; the scheduler's workers only serve
  // a user's actors here, so keep them few.
  SystemHolder() : sys_(cfg_.scheduler_threads(2)) {}
  caf::actor_system& sys() { return sys_; }

 private:
  SystemConfig cfg_;
  caf::actor_system sys_;
};

void release_thread_logger() {
  caf::logger::set_current_actor_system(nullptr);
}

void ResultLog::store(IterationDone& d) {
  newest_ = std::max(newest_, d.k);
  if ((!d.overflow.empty() || !d.overflow_ranks.empty()) &&
      (!last_overflow_ || last_overflow_->iteration < d.k))
    last_overflow_ = OverflowReport{d.k, d.steps.empty() ? 0.0 : double(d.steps[0].scale_used),
                                    d.overflow, d.overflow_ranks};
  if (d.failed) unreported_.push_back(d);
  results_[d.k] = std::move(d);
  while (results_.size() > GradScaler::result_history)
    results_.erase(results_.begin());
}

std::optional<IterationResult> ResultLog::find(iteration_t k) const {
  auto it = results_.find(k);
  if (it == results_.end()) return std::nullopt;
  return it->second;
}

std::optional<IterationDone> ResultLog::take_unreported() {
  if (unreported_.empty()) return std::nullopt;
  IterationDone d = std::move(unreported_.front());
  unreported_.pop_front();
  return d;
}

namespace {
std::string call(const char* method) {
  return std::string("GradScaler.") + method + "()";
}
}  // namespace

}  // namespace internal

GradScaler::Impl::Impl(caf::actor_system* s, const GradScalerOptions& o,
                       const KeeperOptions& keeper) {
  const ScalePolicy p = keeper.policy();
  o.validate();
  // Data parallel: every rank's trajectory must be the same, so every rank's options must be.
  if (o.ranks())
    o.ranks()->require_same("scaler options", std::string("scaler=GradScaler policy=") +
                                                  (p == ScalePolicy::exact ? "exact " : "lagged ") +
                                                  describe(o));
  setup.opts = o;
  setup.policy = p;
  setup.tap = keeper.tap();
  setup.raise_tap_failure = keeper.raise_tap_failure();
  if (!s) {
    own = std::make_unique<internal::SystemHolder>();
    s = &own->sys();
  }
  sys = s;
  self = std::make_unique<caf::scoped_actor>(*sys);
  const auto oa = OptimizerActorOptions().cancel_epoch(setup.cancel_epoch).names(setup.names);
  setup.actors.keeper = spawn_scale_keeper(*sys, o, keeper);
  setup.actors.optimizer = spawn_optimizer_actor(*sys, setup.actors.keeper, o, oa);
  // IterationDone only: a StepResult arriving while the main thread waits for a job's reply
  // would wake it for nothing.
  const auto me = caf::actor_cast<trainer_actor>(*self);
  caf::anon_send(setup.actors.optimizer, subscribe_atom::value, me, /*steps=*/false);
  caf::anon_send(setup.actors.keeper, subscribe_atom::value, me);
  internal::release_thread_logger();
}

GradScaler::Impl::~Impl() {
  if (job()) {
    // Its own optimizer thread would wait for itself: say so and stop, rather than hang.
    std::cerr << "ampactor: a GradScaler was destroyed inside one of its own step jobs, where it "
                 "would wait for itself for ever. Destroy it on the thread that made it.\n";
    std::abort();
  }
  try {
    flush_close();
    // The open iteration is closed too (without an update), so a job of it that failed is
    // reported below like any other.
    caf::anon_send(setup.actors.optimizer, CloseIteration{main.k, false});
    ++main.k;
    wait_for_optimizer();
    drain();
  } catch (const std::exception& e) {
    std::cerr << "ampactor: GradScaler shutdown: " << e.what() << "\n";
  }
  for (const auto& d : log.unreported())
    std::cerr << "ampactor: GradScaler destroyed with an unreported step-job error (iteration "
              << d.k << "): " << d.error_text << "\n";
  // The jobs have run: the pipelines let go of the scaler and of what lives in its actor system,
  // which goes below.
  for (auto& hook : on_gone)
    hook.second();
  auto& a = setup.actors;
  caf::anon_send_exit(a.optimizer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(a.keeper, caf::exit_reason::user_shutdown);
  // The tap hears stopped() as the keeper exits: wait, so a trace is complete when we return.
  if (setup.tap) (*self)->wait_for(a.keeper);
  self.reset();
  a = ScalerActors{};  // a detached actor's thread ends once no handle refers to it
  own.reset();         // joins the optimizer thread and the workers
}

JobContext* GradScaler::Impl::job() const {
  JobContext* c = JobContext::current();
  return c && c->runner() == setup.actors.optimizer.id() ? c : nullptr;
}

void GradScaler::Impl::require_main(const char* method) const {
  using internal::call;
  if (job())
    throw ScalerError(errc::wrong_thread, call(method) +
                                              " cannot be called inside a step job: it would wait "
                                              "for the job itself. Call it from the main thread.");
  if (std::this_thread::get_id() != setup.owner)
    throw ScalerError(errc::wrong_thread, call(method) +
                                              " must be called from the thread that created "
                                              "the GradScaler, or inside one of its step jobs.");
}

void GradScaler::Impl::require_update_thread() const {
  if (job() || std::this_thread::get_id() != setup.owner)
    throw ScalerError(errc::update_off_main_thread, texts::update_off_main_thread);
}

void GradScaler::Impl::require_initialized(const char* method) const {
  if (!main.initialized)
    throw ScalerError(errc::scale_not_initialized, scale_not_initialized_text(method));
}

bool GradScaler::Impl::begin_update() {
  require_update_thread();
  if (!setup.opts.enabled()) {
    close_iteration(std::nullopt);
    raise_unreported();
    return true;
  }
  require_initialized("update");
  return false;
}

float GradScaler::Impl::ensure_scale() {
  auto& m = main;
  if (!m.scale_k && !m.ask_for_scale) {
    drain();
    // exact: the previous iteration's update; lagged: the newest applied one, if any.
    if (setup.policy == ScalePolicy::exact)
      while (!m.applied || m.applied->k < m.k - 1)
        receive_one();
    // A halted keeper (the deepspeed rule at its minimum, a collapsed scale): the scale request
    // below brings its error, with its own code and text.
    if (m.applied && !m.applied->halted) m.scale_k = m.applied->scale, m.guard_k = m.applied->guard;
  }
  if (!m.scale_k) {
    const ScaleReply r = ask_keeper<ScaleReply>(*self, ScaleRequest{m.k});
    m.scale_k = r.scale;
    m.guard_k = r.guard;
    m.initialized = true;
  }
  return *m.scale_k;
}

void GradScaler::Impl::flush_close() {
  if (!main.pending_close) return;
  caf::anon_send(setup.actors.optimizer, CloseIteration{*main.pending_close, false});
  main.pending_close.reset();
}

JobDone GradScaler::Impl::run_job(std::function<void()> fn) {
  flush_close();
  JobDone out;
  caf::error err;
  const float s = main.scale_k.value_or(1.0f);
  StepJob job{main.k, s, std::move(fn), epoch(), UnscalePermit::any(), main.guard_k};
  (*self)
      ->request(setup.actors.optimizer, caf::infinite, std::move(job))
      .receive([&](JobDone& d) { out = d; }, [&](caf::error& e) { err = std::move(e); });
  if (err) throw to_exception(err);
  main.known_unscales += out.unscales;
  return out;
}

void GradScaler::Impl::drain() {
  auto& me = *self;
  while (!me->mailbox().empty())
    receive_one();
}

void GradScaler::Impl::receive_one() {
  (*self)->receive([&](IterationDone& d) { log.store(d); },
                   [&](const UpdateApplied& a) {
                     if (!main.applied || a.k > main.applied->k) main.applied = a;
                   },
                   caf::others >> [](caf::message_view& x) -> caf::result<caf::message> {
                     // Nothing else is sent here; say so rather than drop it in silence.
                     std::cerr << "ampactor: GradScaler ignored an unexpected message: "
                               << caf::to_string(x.copy_content_to_message()) << "\n";
                     return caf::message{};
                   });
}

void GradScaler::Impl::raise_unreported() {
  drain();
  if (auto d = log.take_unreported()) throw ScalerError(d->error_code, d->error_text);
  // A tap that stopped recording (the trace file said it on stderr already): raised once, if
  // asked for.
  if (setup.tap && !setup.tap_failure_seen && setup.raise_tap_failure) {
    const std::string why = setup.tap->failure();
    if (!why.empty()) {
      setup.tap_failure_seen = true;
      throw ScalerError(errc::bad_trace, why);
    }
  }
}

void GradScaler::Impl::close_iteration(const std::optional<KeeperInput>& update) {
  auto& a = setup.actors;
  if (update)
    std::visit(
        [&](const auto& u) {
          using T = std::decay_t<decltype(u)>;
          if constexpr (std::is_same_v<T, UpdateScale> || std::is_same_v<T, UpdateWhenClosed> ||
                        std::is_same_v<T, SetScale>)
            caf::anon_send(a.keeper, u);
        },
        *update);
  const auto* set = update ? std::get_if<SetScale>(&*update) : nullptr;
  const bool after_jobs = set && set->after_jobs;
  const bool report = update && (std::holds_alternative<UpdateWhenClosed>(*update) || after_jobs);
  flush_close();
  if (report)  // the keeper waits for it
    caf::anon_send(a.optimizer,
                   CloseIteration{main.k, /*report_unscales=*/true, /*inf_checks_required=*/!set});
  else
    main.pending_close = main.k;
  if (update) main.ask_for_scale = false;  // UpdateApplied{k} will carry the next scale
  ++main.k;
  main.scale_k.reset();
  main.known_unscales = 0;
  main.async_in_k = false;
  main.jobs_in_k = false;
}

ScaleParams GradScaler::Impl::params(bool up_to_date, const char* method) {
  if (job()) {
    if (up_to_date)
      throw ScalerError(errc::wrong_thread,
                        internal::call(method) +
                            " with up_to_date=true cannot be called inside a step job: it would "
                            "wait for the job itself.");
    caf::scoped_actor tmp{*sys};
    return ask_keeper<ScaleParams>(tmp, GetParams{false});
  }
  require_main(method);
  return ask_keeper<ScaleParams>(*self, GetParams{up_to_date});
}

}  // namespace ampactor
