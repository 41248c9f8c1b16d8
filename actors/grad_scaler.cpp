#include "internal/grad_scaler_impl.h"

#include <algorithm>

#include <ampactor/scaler/local_grad_scaler.h>

#include <caf/send.hpp>

#include <iostream>

namespace ampactor {

GradScaler::GradScaler(const GradScalerOptions& opts, const KeeperOptions& keeper)
    : impl_(std::make_unique<Impl>(nullptr, opts, keeper)) {}

GradScaler::GradScaler(const GradScalerOptions& opts, ScalePolicy policy,
                       std::shared_ptr<KeeperTap> tap)
    : GradScaler(opts, KeeperOptions().policy(policy).tap(std::move(tap))) {}

GradScaler::GradScaler(double init_scale, double growth_factor, double backoff_factor,
                       std::int64_t growth_interval, bool enabled)
    : GradScaler(GradScalerOptions::positional(init_scale, growth_factor, backoff_factor,
                                               growth_interval, enabled)) {}

GradScaler::GradScaler(caf::actor_system& sys, const GradScalerOptions& opts,
                       const KeeperOptions& keeper)
    : impl_(std::make_unique<Impl>(&sys, opts, keeper)) {}

GradScaler::GradScaler(caf::actor_system& sys, const GradScalerOptions& opts, ScalePolicy policy,
                       std::shared_ptr<KeeperTap> tap)
    : GradScaler(sys, opts, KeeperOptions().policy(policy).tap(std::move(tap))) {}

GradScaler::~GradScaler() = default;

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  Impl& m = *impl_;
  if (!m.opts().enabled()) return outputs;
  if (!outputs.defined()) throw ScalerError(errc::bad_outputs, texts::bad_outputs);
  if (JobContext* j = m.job()) return scale_by(outputs, j->scale());
  m.require_main("scale");
  return scale_by(outputs, m.ensure_scale());
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!impl_->opts().enabled()) return outputs;
  return scale_each(outputs, [this](const at::Tensor& t) { return scale(t); });
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  Impl& m = *impl_;
  if (!m.opts().enabled()) return;
  if (JobContext* j = m.job()) {
    j->unscale_(optimizer);
    return;
  }
  m.require_main("unscale_");
  m.raise_unreported();
  m.require_initialized("unscale_");
  m.ensure_scale();
  m.run_and_rethrow([&] { JobContext::current()->unscale_(optimizer); });
}

std::optional<at::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer,
                                           LossClosure closure) {
  Impl& m = *impl_;
  if (JobContext* j = m.job()) return j->step(optimizer, closure).ret;
  m.require_main("step");
  if (m.opts().enabled() && closure)
    throw ScalerError(errc::closure_unsupported, texts::closure_unsupported);
  m.raise_unreported();
  if (m.opts().enabled()) {
    m.require_initialized("step");
    m.ensure_scale();
  }
  return m.run_and_rethrow([&] { return JobContext::current()->step(optimizer, closure).ret; });
}

void GradScaler::update() {
  Impl& m = *impl_;
  if (m.begin_update()) return;
  const auto& s = m.main;
  if (!s.async_in_k && s.known_unscales == 0)
    throw ScalerError(errc::no_inf_checks_before_update, texts::no_inf_checks_before_update);
  if (s.async_in_k)
    m.close_iteration(UpdateWhenClosed{s.k});
  else
    m.close_iteration(UpdateScale{s.k, s.known_unscales});
  m.raise_unreported();
}

void GradScaler::update(double new_scale) {
  Impl& m = *impl_;
  if (m.begin_update()) return;
  check_new_scale(new_scale);
  // With jobs queued in this iteration, the keeper waits for the optimizer to close it: a job
  // that fails or is cancelled leaves the scale as it is, as it does for update().
  m.close_iteration(SetScale{m.main.k, new_scale, m.main.jobs_in_k});
  m.raise_unreported();
}

void GradScaler::update(const at::Tensor& new_scale) {
  Impl& m = *impl_;
  m.require_update_thread();
  if (!m.opts().enabled()) return update(1.0);  // closes the iteration, changes no scale
  m.require_initialized("update");
  update(new_scale_value(new_scale));
}

double GradScaler::get_scale() {
  Impl& m = *impl_;
  if (!m.opts().enabled()) return 1.0;
  if (JobContext* j = m.job()) return j->scale();
  m.require_main("get_scale");
  if (m.main.scale_k) return *m.main.scale_k;
  return m.params(m.setup.policy == ScalePolicy::exact, "get_scale").scale;
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
  caf::anon_send(impl_->setup.actors.keeper, SetGrowthFactor{v});
}
void GradScaler::set_backoff_factor(double v) {
  impl_->require_main("set_backoff_factor");
  check_backoff_factor(v);
  caf::anon_send(impl_->setup.actors.keeper, SetBackoffFactor{v});
}
void GradScaler::set_growth_interval(std::int64_t v) {
  impl_->require_main("set_growth_interval");
  check_growth_interval(v);
  caf::anon_send(impl_->setup.actors.keeper, SetGrowthInterval{v});
}

bool GradScaler::is_enabled() const {
  return impl_->opts().enabled();  // fixed at construction: any thread may ask
}

StateDict GradScaler::state_dict() const {
  Impl& m = *impl_;
  m.require_main("state_dict");
  if (!m.opts().enabled()) return {};
  return from_message(m.ask_keeper<StateDictMsg>(*m.self, GetStateDict{}));
}

void GradScaler::load_state_dict(const StateDict& sd) {
  Impl& m = *impl_;
  m.require_main("load_state_dict");
  if (!m.opts().enabled()) return;
  ScaleState scratch(m.opts());
  ampactor::load_state_dict(scratch, sd);  // torch's refusals, here and before anything changes
  m.ask_keeper<ScaleParams>(*m.self, LoadStateDict{to_message(sd)});
  m.main.scale_k.reset();  // the loaded scale applies from the next scale() on, as in torch
  m.main.ask_for_scale = true;
}

void GradScaler::submit(std::function<void()> fn, const SubmitOptions& options) {
  Impl& m = *impl_;
  m.require_main("submit");
  if (!fn) throw ScalerError(errc::bad_option, "GradScaler.submit(): empty function");
  const UnscalePermit permit = options.unscales();
  const float s = m.opts().enabled() ? m.ensure_scale() : 1.0f;
  m.flush_close();
  caf::anon_send(m.setup.actors.optimizer,
                 StepJob{m.main.k, s, std::move(fn), m.epoch(), permit, m.main.guard_k});
  if (permit.kind() == UnscalePermit::Kind::any) m.main.async_in_k = true;
  m.main.jobs_in_k = true;
  if (m.opts().enabled()) m.main.known_unscales += permit.counted();
}

bool GradScaler::submit_from_backward(std::function<void()> fn) {
  // The main thread waits in backward() meanwhile: its state is this thread's until backward
  // returns (the autograd engine's queue and its completion order the two threads both ways).
  Impl& m = *impl_;
  if (m.job() || !m.opts().enabled() || !m.main.scale_k) return false;
  m.flush_close();
  caf::anon_send(m.setup.actors.optimizer,
                 StepJob{m.main.k, *m.main.scale_k, std::move(fn), m.epoch(), UnscalePermit::none(),
                         m.main.guard_k});
  m.main.jobs_in_k = true;
  return true;
}

void GradScaler::run_on_optimizer(const std::function<void()>& fn) {
  Impl& m = *impl_;
  m.require_main("run_on_optimizer");
  m.raise_unreported();
  if (m.opts().enabled()) m.ensure_scale();
  m.run_and_rethrow(fn);
}

void GradScaler::sync() {
  Impl& m = *impl_;
  m.require_main("sync");
  m.wait_for_optimizer();
  m.ask_keeper<ScaleParams>(*m.self, GetParams{true});
  m.raise_unreported();
}

void GradScaler::finish_jobs() noexcept {
  Impl& m = *impl_;
  if (m.job()) {
    std::cerr << "ampactor: finish_jobs() inside a step job would wait for itself; ignored\n";
    return;
  }
  try {
    m.wait_for_optimizer();
    m.drain();
  } catch (const std::exception& e) {
    std::cerr << "ampactor: finish_jobs: " << e.what() << "\n";
  }
}

void GradScaler::cancel() {
  impl_->require_main("cancel");
  impl_->setup.cancel_epoch->fetch_add(1);
}

iteration_t GradScaler::iteration() const {
  impl_->require_main("iteration");  // the main thread's own count: elsewhere it would race
  return impl_->main.k;
}

GradScaler& GradScaler::name_parameters(const torch::OrderedDict<std::string, at::Tensor>& named) {
  impl_->setup.names->add(named);
  return *this;
}

std::optional<OverflowReport> GradScaler::last_overflow() {
  Impl& m = *impl_;
  m.require_main("last_overflow");
  m.flush_close();
  m.drain();
  return m.log.last_overflow();
}

std::optional<IterationResult> GradScaler::poll_result(iteration_t k) {
  Impl& m = *impl_;
  m.require_main("poll_result");
  m.flush_close();
  m.drain();
  return m.log.find(k);
}

IterationResult GradScaler::wait_result(iteration_t k) {
  Impl& m = *impl_;
  m.require_main("wait_result");
  m.flush_close();
  if (k >= m.main.k)
    throw ScalerError(
        errc::iteration_open,
        "iteration " + std::to_string(k) + " is not closed yet: its result comes after update()");
  m.drain();
  while (m.log.newest() < k)
    m.receive_one();
  auto found = m.log.find(k);
  if (!found)
    throw ScalerError(errc::iteration_open, "no result is kept for iteration " + std::to_string(k) +
                                                " (the last " + std::to_string(result_history) +
                                                " are kept)");
  return *found;
}

std::optional<bool> GradScaler::found_inf(const torch::optim::Optimizer& optimizer) {
  Impl& m = *impl_;
  if (JobContext* j = m.job()) return j->found_inf(optimizer);
  m.require_main("found_inf");
  std::optional<bool> out;
  m.run_job([&] { out = JobContext::current()->found_inf(optimizer); });  // cannot throw
  return out;
}

ScalePolicy GradScaler::policy() const {
  return impl_->setup.policy;
}
const GradScalerOptions& GradScaler::options() const {
  return impl_->setup.opts;
}
const std::shared_ptr<KeeperTap>& GradScaler::tap() const {
  return impl_->setup.tap;
}

std::string GradScaler::tap_failure() const {
  return impl_->setup.tap ? impl_->setup.tap->failure() : std::string();
}
const ScalerActors& GradScaler::actors() const {
  return impl_->setup.actors;
}

caf::actor_system& GradScaler::system() const {
  return *impl_->sys;
}

void GradScaler::on_gone(const void* who, std::function<void()> gone) {
  impl_->on_gone.emplace_back(who, std::move(gone));
}

void GradScaler::forget(const void* who) noexcept {
  auto& hooks = impl_->on_gone;
  hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(), [&](const auto& h) { return h.first == who; }),
      hooks.end());
}

}  // namespace ampactor
