#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/actors/trace.h>
#include <ampactor/grad_scaler.h>
#include <ampactor/messages/registry.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/others.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <deque>
#include <exception>
#include <iostream>
#include <map>
#include <thread>

namespace ampactor {

namespace {

struct OwnConfig : caf::actor_system_config {
  OwnConfig() {
    register_messages(*this);
    // The keeper and the optimizer have threads of their own; the scheduler's workers only
    // serve a user's actors here, so keep them few.
    set("scheduler.max-threads", std::size_t{2});
  }
};

std::string call(const char* method) {
  return std::string("GradScaler.") + method + "()";
}

}  // namespace

struct GradScaler::Impl {
  GradScalerOptions opts;
  ScalePolicy policy;
  std::string trace_path;
  std::shared_ptr<TraceFile> trace;  // also held by the keeper while it records
  std::unique_ptr<OwnConfig> own_cfg;
  std::unique_ptr<caf::actor_system> own_sys;
  caf::actor_system* sys = nullptr;
  std::unique_ptr<caf::scoped_actor> self;  // the trainer: the main thread's actor
  ScalerActors actors;
  std::thread::id owner = std::this_thread::get_id();
  std::shared_ptr<std::atomic<std::uint64_t>> cancel_epoch =
      std::make_shared<std::atomic<std::uint64_t>>(0);

  iteration_t k = 0;
  bool initialized = false;         // a ScaleRequest has been answered (torch: _scale exists)
  std::optional<float> scale_k;     // the scale of iteration k, once asked for
  std::int32_t known_unscales = 0;  // UnscaleDone{k} sent by jobs the main thread waited for
  bool async_in_k = false;          // submit() in iteration k: the optimizer counts unscales

  // The exact policy's scale for iteration k is the keeper's scale once update k-1 is applied;
  // the lagged policy's is the newest applied one. The keeper pushes each (UpdateApplied), so
  // scale() costs no round trip of its own: a blocking request wakes the keeper's thread, which
  // on a machine whose cores the trainer and the optimizer keep busy waits for a time slice
  // (milliseconds). After a load_state_dict the pushed value is stale until the next update: ask.
  std::optional<UpdateApplied> applied;
  bool ask_for_scale = true;
  // A CloseIteration that needs no answer rides along with the next message to the optimizer
  // (one wake-up of its thread instead of two).
  std::optional<iteration_t> pending_close;

  std::map<iteration_t, IterationDone> results;
  iteration_t newest_result = -1;
  std::deque<IterationDone> unreported;  // failed iterations not yet rethrown

  Impl(caf::actor_system* s, const GradScalerOptions& o, ScalePolicy p, const std::string& tp)
      : opts(o), policy(p), trace_path(tp) {
    opts.validate();
    if (!trace_path.empty()) trace = std::make_shared<TraceFile>(trace_path);
    if (!s) {
      own_cfg = std::make_unique<OwnConfig>();
      own_sys = std::make_unique<caf::actor_system>(*own_cfg);
      s = own_sys.get();
    }
    sys = s;
    self = std::make_unique<caf::scoped_actor>(*sys);
    const auto oa = OptimizerActorOptions().cancel_epoch(cancel_epoch);
    actors.keeper = spawn_scale_keeper(*sys, opts, policy, oa.detached(), trace);
    actors.optimizer = spawn_optimizer_actor(*sys, actors.keeper, opts, oa);
    // IterationDone only: a StepResult arriving while the main thread waits for a job's reply
    // would wake it for nothing.
    caf::anon_send(actors.optimizer, subscribe_atom::value, caf::actor{*self}, false);
    caf::anon_send(actors.keeper, subscribe_atom::value, caf::actor{*self});
  }

  ~Impl() {
    try {
      flush_close();
      wait_for_optimizer();
      drain();
    } catch (const std::exception& e) {
      std::cerr << "ampactor: GradScaler shutdown: " << e.what() << "\n";
    }
    for (const auto& d : unreported)
      std::cerr << "ampactor: GradScaler destroyed with an unreported step-job error (iteration "
                << d.k << "): " << d.error_text << "\n";
    caf::anon_send_exit(actors.optimizer, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(actors.keeper, caf::exit_reason::user_shutdown);
    if (trace) {
      // The keeper records until it exits: wait, so the file is complete when we return.
      (*self)->wait_for(actors.keeper);
      if (!trace->close())
        std::cerr << "ampactor: writing the trace " << trace_path << " failed; it is incomplete\n";
    }
    self.reset();
    actors = ScalerActors{};  // a detached actor's thread ends once no handle refers to it
    own_sys.reset();          // joins the optimizer thread and the workers
  }

  /// The job running on this thread, if it is one of this scaler's.
  JobContext* job() const {
    JobContext* c = JobContext::current();
    return c && c->runner() == actors.optimizer.id() ? c : nullptr;
  }

  void require_main(const char* method) const {
    if (job())
      throw ScalerError(errc::wrong_thread,
                        call(method) +
                            " cannot be called inside a step job: it would wait for "
                            "the job itself. Call it from the main thread.");
    if (std::this_thread::get_id() != owner)
      throw ScalerError(errc::wrong_thread, call(method) +
                                                " must be called from the thread that created "
                                                "the GradScaler, or inside one of its step jobs.");
  }

  void require_update_thread() const {
    if (job() || std::this_thread::get_id() != owner)
      throw ScalerError(errc::update_off_main_thread, texts::update_off_main_thread);
  }

  /// update()'s common start: the thread rule; disabled, it only closes the iteration (true:
  /// nothing more to do); enabled, the scale must exist.
  bool begin_update() {
    require_update_thread();
    if (!opts.enabled()) {
      close_iteration(nullptr);
      raise_unreported();
      return true;
    }
    require_initialized("update");
    return false;
  }

  void require_initialized(const char* method) const {
    if (!initialized)
      throw ScalerError(errc::scale_not_initialized, scale_not_initialized_text(method));
  }

  float ensure_scale() {
    if (!scale_k && !ask_for_scale && policy == ScalePolicy::exact) {
      drain();
      while (!applied || applied->k < k - 1)
        receive_one();
      scale_k = applied->scale;
    }
    if (!scale_k && !ask_for_scale && policy == ScalePolicy::lagged) {
      drain();
      if (applied) scale_k = applied->scale;
    }
    if (!scale_k) {
      caf::error err;
      (*self)
          ->request(actors.keeper, caf::infinite, ScaleRequest{k})
          .receive([&](const ScaleReply& r) { scale_k = r.scale; },
                   [&](caf::error& e) { err = std::move(e); });
      if (err) throw to_exception(err);
      initialized = true;
    }
    return *scale_k;
  }

  template <class Req, class Res>
  Res ask_keeper(caf::scoped_actor& who, Req req) {
    Res out{};
    caf::error err;
    who->request(actors.keeper, caf::infinite, std::move(req))
        .receive([&](Res& r) { out = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
    if (err) throw to_exception(err);
    return out;
  }

  /// Runs fn as a job of iteration k and waits for it. fn catches its own exceptions (so they
  /// reach the caller as they were thrown and do not fail the iteration).
  void flush_close() {
    if (!pending_close) return;
    caf::anon_send(actors.optimizer, CloseIteration{*pending_close, false});
    pending_close.reset();
  }

  JobDone run_job(std::function<void()> fn) {
    flush_close();
    JobDone out;
    caf::error err;
    const float s = scale_k.value_or(1.0f);
    (*self)
        ->request(actors.optimizer, caf::infinite, StepJob{k, s, std::move(fn), epoch()})
        .receive([&](JobDone& d) { out = d; }, [&](caf::error& e) { err = std::move(e); });
    if (err) throw to_exception(err);
    known_unscales += out.unscales;
    return out;
  }

  std::uint64_t epoch() const { return cancel_epoch->load(); }

  /// Every earlier job and close has run: its IterationDone messages are in our mailbox.
  void wait_for_optimizer() {
    run_job([] {});
  }

  void store(IterationDone& d) {
    newest_result = std::max(newest_result, d.k);
    if (d.failed) unreported.push_back(d);
    results[d.k] = std::move(d);
    while (results.size() > GradScaler::result_history)
      results.erase(results.begin());
  }

  /// Takes what the optimizer published without waiting.
  void drain() {
    auto& me = *self;
    while (!me->mailbox().empty())
      receive_one();
  }

  void receive_one() {
    (*self)->receive([&](IterationDone& d) { store(d); },
                     [&](const UpdateApplied& a) {
                       if (!applied || a.k > applied->k) applied = a;
                     },
                     caf::others >> [](caf::message_view&) -> caf::result<caf::message> {
                       return caf::message{};
                     });
  }

  void raise_unreported() {
    drain();
    if (unreported.empty()) return;
    IterationDone d = std::move(unreported.front());
    unreported.pop_front();
    throw ScalerError(d.error_code, d.error_text);
  }

  void close_iteration(const UpdateScale* u) {
    if (u) caf::anon_send(actors.keeper, *u);
    const bool report = u && u->expected_unscales == unscales_from_optimizer;
    flush_close();
    if (report)
      caf::anon_send(actors.optimizer, CloseIteration{k, true});  // the keeper waits for it
    else
      pending_close = k;
    if (u) ask_for_scale = false;  // UpdateApplied{k} will carry the next scale
    ++k;
    scale_k.reset();
    known_unscales = 0;
    async_in_k = false;
  }

  ScaleParams params(bool up_to_date, const char* method) {
    if (JobContext* j = job()) {
      if (up_to_date)
        throw ScalerError(errc::wrong_thread,
                          call(method) +
                              " with up_to_date=true cannot be called inside a step "
                              "job: it would wait for the job itself.");
      caf::scoped_actor tmp{*sys};
      return ask_keeper<GetParams, ScaleParams>(tmp, GetParams{j->iteration(), false});
    }
    require_main(method);
    return ask_keeper<GetParams, ScaleParams>(*self, GetParams{k, up_to_date});
  }
};

GradScaler::GradScaler(const GradScalerOptions& opts, ScalePolicy policy,
                       const std::string& trace_path)
    : impl_(std::make_unique<Impl>(nullptr, opts, policy, trace_path)) {}

GradScaler::GradScaler(double init_scale, double growth_factor, double backoff_factor,
                       std::int64_t growth_interval, bool enabled)
    : GradScaler(
          // In validate()'s order, so a call with several bad values is refused for the same one.
          GradScalerOptions()
              .enabled(enabled)
              .growth_factor(growth_factor)
              .backoff_factor(backoff_factor)
              .growth_interval(growth_interval)
              .init_scale(init_scale)) {}

GradScaler::GradScaler(caf::actor_system& sys, const GradScalerOptions& opts, ScalePolicy policy,
                       const std::string& trace_path)
    : impl_(std::make_unique<Impl>(&sys, opts, policy, trace_path)) {}

GradScaler::~GradScaler() = default;

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  Impl& m = *impl_;
  if (!m.opts.enabled()) return outputs;
  if (!outputs.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  if (JobContext* j = m.job()) return scale_by(outputs, j->scale());
  m.require_main("scale");
  return scale_by(outputs, m.ensure_scale());
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!impl_->opts.enabled()) return outputs;
  return scale_each(outputs, [this](const at::Tensor& t) { return scale(t); });
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  Impl& m = *impl_;
  if (!m.opts.enabled()) return;
  if (JobContext* j = m.job()) {
    j->unscale_(optimizer);
    return;
  }
  m.require_main("unscale_");
  m.raise_unreported();
  m.require_initialized("unscale_");
  m.ensure_scale();
  std::exception_ptr ep;
  m.run_job([&] {
    try {
      JobContext::current()->unscale_(optimizer);
    } catch (...) {
      ep = std::current_exception();
    }
  });
  if (ep) std::rethrow_exception(ep);
}

std::optional<at::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer,
                                           LossClosure closure) {
  Impl& m = *impl_;
  if (JobContext* j = m.job()) return j->step(optimizer, closure).ret;
  m.require_main("step");
  if (m.opts.enabled() && closure)
    throw ScalerError(errc::closure_unsupported, texts::closure_unsupported);
  m.raise_unreported();
  if (m.opts.enabled()) {
    m.require_initialized("step");
    m.ensure_scale();
  }
  std::exception_ptr ep;
  std::optional<at::Tensor> ret;
  m.run_job([&] {
    try {
      ret = JobContext::current()->step(optimizer, closure).ret;
    } catch (...) {
      ep = std::current_exception();
    }
  });
  if (ep) std::rethrow_exception(ep);
  return ret;
}

void GradScaler::update() {
  Impl& m = *impl_;
  if (m.begin_update()) return;
  if (!m.async_in_k && m.known_unscales == 0)
    throw ScalerError(errc::no_inf_checks_before_update, texts::no_inf_checks_before_update);
  const std::int32_t expected = m.async_in_k ? unscales_from_optimizer : m.known_unscales;
  const UpdateScale u{m.k, expected, false, 0};
  m.close_iteration(&u);
  m.raise_unreported();
}

void GradScaler::update(double new_scale) {
  Impl& m = *impl_;
  if (m.begin_update()) return;
  check_new_scale(new_scale);
  const UpdateScale u{m.k, 0, true, new_scale};
  m.close_iteration(&u);
  m.raise_unreported();
}

void GradScaler::update(const at::Tensor& new_scale) {
  Impl& m = *impl_;
  m.require_update_thread();
  if (!m.opts.enabled()) return update(1.0);  // closes the iteration, changes no scale
  m.require_initialized("update");
  update(new_scale_value(new_scale));
}

double GradScaler::get_scale() {
  Impl& m = *impl_;
  if (!m.opts.enabled()) return 1.0;
  if (JobContext* j = m.job()) return j->scale();
  m.require_main("get_scale");
  if (m.scale_k) return *m.scale_k;
  return m.params(m.policy == ScalePolicy::exact, "get_scale").scale;
}

double GradScaler::get_growth_factor(bool up_to_date) {
  return impl_->params(up_to_date, "get_growth_factor").growth_factor;
}
double GradScaler::get_backoff_factor(bool up_to_date) {
  return impl_->params(up_to_date, "get_backoff_factor").backoff_factor;
}
std::int64_t GradScaler::get_growth_interval(bool up_to_date) {
  return impl_->params(up_to_date, "get_growth_interval").growth_interval;
}

void GradScaler::set_growth_factor(double v) {
  impl_->require_main("set_growth_factor");
  check_growth_factor(v);
  caf::anon_send(impl_->actors.keeper, SetParam{impl_->k, Param::growth_factor, v});
}
void GradScaler::set_backoff_factor(double v) {
  impl_->require_main("set_backoff_factor");
  check_backoff_factor(v);
  caf::anon_send(impl_->actors.keeper, SetParam{impl_->k, Param::backoff_factor, v});
}
void GradScaler::set_growth_interval(std::int64_t v) {
  impl_->require_main("set_growth_interval");
  check_growth_interval(v);
  caf::anon_send(impl_->actors.keeper, SetParam{impl_->k, Param::growth_interval, double(v)});
}

bool GradScaler::is_enabled() const {
  return impl_->opts.enabled();
}

StateDict GradScaler::state_dict() {
  Impl& m = *impl_;
  m.require_main("state_dict");
  if (!m.opts.enabled()) return {};
  return from_message(m.ask_keeper<GetStateDict, StateDictMsg>(*m.self, GetStateDict{m.k}));
}

void GradScaler::load_state_dict(const StateDict& sd) {
  Impl& m = *impl_;
  m.require_main("load_state_dict");
  if (!m.opts.enabled()) return;
  ScaleState scratch(m.opts);
  ampactor::load_state_dict(scratch, sd);  // torch's refusals, here and before anything changes
  m.ask_keeper<LoadStateDict, ScaleParams>(*m.self, LoadStateDict{m.k, to_message(sd)});
  m.scale_k.reset();  // the loaded scale applies from the next scale() on, as in torch
  m.ask_for_scale = true;
}

void GradScaler::submit(std::function<void()> fn, bool may_unscale, std::int32_t counted_unscales) {
  Impl& m = *impl_;
  m.require_main("submit");
  if (!fn) throw std::invalid_argument("GradScaler.submit(): empty function");
  if (counted_unscales < 0 || (may_unscale && counted_unscales != 0))
    throw std::invalid_argument(
        "GradScaler.submit(): counted_unscales must be >= 0, and 0 unless may_unscale is false; "
        "got " +
        std::to_string(counted_unscales));
  const float s = m.opts.enabled() ? m.ensure_scale() : 1.0f;
  m.flush_close();
  caf::anon_send(m.actors.optimizer,
                 StepJob{m.k, s, std::move(fn), m.epoch(), may_unscale, counted_unscales});
  if (may_unscale) m.async_in_k = true;
  if (m.opts.enabled()) m.known_unscales += counted_unscales;
}

void GradScaler::run_on_optimizer(const std::function<void()>& fn) {
  Impl& m = *impl_;
  m.require_main("run_on_optimizer");
  m.raise_unreported();
  if (m.opts.enabled()) m.ensure_scale();
  std::exception_ptr ep;
  m.run_job([&] {
    try {
      fn();
    } catch (...) {
      ep = std::current_exception();
    }
  });
  if (ep) std::rethrow_exception(ep);
}

void GradScaler::sync() {
  Impl& m = *impl_;
  m.require_main("sync");
  m.wait_for_optimizer();
  m.ask_keeper<GetParams, ScaleParams>(*m.self, GetParams{m.k, true});
  m.raise_unreported();
}

void GradScaler::cancel() {
  impl_->require_main("cancel");
  impl_->cancel_epoch->fetch_add(1);
}

iteration_t GradScaler::iteration() const {
  return impl_->k;
}

std::optional<IterationResult> GradScaler::poll_result(iteration_t k) {
  Impl& m = *impl_;
  m.require_main("poll_result");
  m.flush_close();
  m.drain();
  auto it = m.results.find(k);
  if (it == m.results.end()) return std::nullopt;
  return it->second;
}

IterationResult GradScaler::wait_result(iteration_t k) {
  Impl& m = *impl_;
  m.require_main("wait_result");
  m.flush_close();
  if (k >= m.k)
    throw ScalerError(
        errc::iteration_open,
        "iteration " + std::to_string(k) + " is not closed yet: its result comes after update()");
  m.drain();
  while (m.newest_result < k)
    m.receive_one();
  auto it = m.results.find(k);
  if (it == m.results.end())
    throw ScalerError(errc::iteration_open, "no result is kept for iteration " + std::to_string(k) +
                                                " (the last " + std::to_string(result_history) +
                                                " are kept)");
  return it->second;
}

void GradScaler::subscribe(const caf::actor& who) {
  caf::anon_send(impl_->actors.optimizer, subscribe_atom::value, who);
  caf::anon_send(impl_->actors.keeper, subscribe_atom::value, who);
}

std::optional<bool> GradScaler::found_inf(const torch::optim::Optimizer& optimizer) {
  Impl& m = *impl_;
  if (JobContext* j = m.job()) return j->found_inf(optimizer);
  m.require_main("found_inf");
  std::optional<bool> out;
  m.run_job([&] { out = JobContext::current()->found_inf(optimizer); });
  return out;
}

ScalePolicy GradScaler::policy() const {
  return impl_->policy;
}
const GradScalerOptions& GradScaler::options() const {
  return impl_->opts;
}
const std::string& GradScaler::trace_path() const {
  return impl_->trace_path;
}
const ScalerActors& GradScaler::actors() const {
  return impl_->actors;
}

}  // namespace ampactor
