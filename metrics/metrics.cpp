// Metrics: the join of the keeper's and the pipelines' reports into one record per iteration.
#include <ampactor/metrics/metrics.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>

#include <ampactor/core/errors.h>

namespace ampactor {

MetricsOptions& MetricsOptions::max_pending(std::int64_t v) {
  if (v < 1)
    throw ScalerError(errc::bad_option,
                      "MetricsOptions: max_pending must be >= 1, got " + std::to_string(v));
  max_pending_ = v;
  return *this;
}

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

struct Metrics::State {
  struct Pending {
    IterationMetrics m;
    bool keeper = false;
    int trainer = 0, optimizer = 0;  // pipeline reports in
  };
  explicit State(MetricsOptions o) : options(std::move(o)) {}
  Pending& at(iteration_t k);
  void release();  // writes what is complete or waited for long enough; lock held
  void write(IterationMetrics& m);

  const MetricsOptions options;
  std::mutex m;
  std::vector<std::shared_ptr<MetricsSink>> sinks;
  std::vector<std::string> dropped;  // by sink: why it was dropped ("" while it writes)
  std::map<iteration_t, Pending> pending;
  int pipelines = 0;
  iteration_t newest = -1;  // the latest iteration any report was about
  std::int64_t written = 0;
  bool closed = false;
};

Metrics::Metrics(MetricsOptions options) : s_(std::make_unique<State>(std::move(options))) {}

Metrics::~Metrics() {
  close();
}

Metrics& Metrics::sink(std::shared_ptr<MetricsSink> s) {
  if (!s) throw ScalerError(errc::bad_option, "Metrics::sink: the sink is null");
  std::lock_guard<std::mutex> lock(s_->m);
  s_->sinks.push_back(std::move(s));
  s_->dropped.emplace_back();
  return *this;
}

Metrics::State::Pending& Metrics::State::at(iteration_t k) {
  newest = std::max(newest, k);
  auto [it, made] = pending.try_emplace(k);
  if (made) it->second.m.k = k;
  return it->second;
}

void Metrics::State::write(IterationMetrics& m) {
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    if (!dropped[i].empty()) continue;
    try {
      sinks[i]->write(m);
    } catch (const std::exception& e) {
      dropped[i] = std::string("metrics sink dropped: ") + e.what();
      std::cerr << "ampactor: " << dropped[i] << "\n";
    }
  }
  ++written;
}

void Metrics::State::release() {
  while (!pending.empty()) {
    auto it = pending.begin();
    Pending& p = it->second;
    const bool whole = p.keeper && p.trainer >= pipelines && p.optimizer >= pipelines;
    const bool aged = newest - it->first >= options.max_pending();
    if (!whole && !aged && !closed) return;
    p.m.complete = whole;
    if (!p.keeper) p.m.wall_time = now();
    write(p.m);
    pending.erase(it);
  }
}

void Metrics::close() {
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->closed) return;
  s_->closed = true;
  s_->release();
  for (std::size_t i = 0; i < s_->sinks.size(); ++i) {
    if (!s_->dropped[i].empty()) continue;
    try {
      s_->sinks[i]->close();
    } catch (const std::exception& e) {
      s_->dropped[i] = std::string("metrics sink dropped at close: ") + e.what();
      std::cerr << "ampactor: " << s_->dropped[i] << "\n";
    }
  }
}

std::int64_t Metrics::written() const {
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->written;
}

std::string Metrics::failure() const {
  std::lock_guard<std::mutex> lock(s_->m);
  for (std::size_t i = 0; i < s_->sinks.size(); ++i) {
    if (!s_->dropped[i].empty()) return s_->dropped[i];
    std::string f = s_->sinks[i]->failure();
    if (!f.empty()) return f;
  }
  return {};
}

void Metrics::started(const GradScalerOptions&, ScalePolicy) {}

void Metrics::input(peer_id, const KeeperInput& in) {
  const auto* d = std::get_if<UnscaleDone>(&in);
  if (!d) return;
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->closed) return;
  IterationMetrics& m = s_->at(d->k).m;
  // What the gradients were made at, as the optimizer reports it (a trainer that knew its scale
  // from the keeper's pushes asked no ScaleRequest).
  if (d->scale_used > 0) m.scale_used = d->scale_used;
  for (std::int32_t r : d->found_by)
    if (std::find(m.found_by.begin(), m.found_by.end(), r) == m.found_by.end())
      m.found_by.push_back(r);
  std::sort(m.found_by.begin(), m.found_by.end());
  for (const OverflowTensor& t : d->overflow)
    if (std::find(m.overflow.begin(), m.overflow.end(), t.name) == m.overflow.end())
      m.overflow.push_back(t.name);
}

void Metrics::output(const KeeperOutput& out) {
  if (const auto* r = std::get_if<KeeperReply>(&out)) {
    const auto* s = std::get_if<ScaleReply>(&r->msg);
    if (!s) return;
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->closed) return;
    IterationMetrics& m = s_->at(s->k).m;
    if (m.scale_used == 0) m.scale_used = s->scale;  // an unscale report says it too, and wins
    return;
  }
  const UpdateApplied& u = std::get<KeeperPush>(out).msg;
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->closed) return;
  State::Pending& p = s_->at(u.k);
  IterationMetrics& m = p.m;
  m.wall_time = now();
  m.scale = u.scale;
  m.found_inf = u.found_inf;
  m.abandoned = u.abandoned;
  m.skipped = u.found_inf && !u.abandoned;
  m.backed_off = u.backed_off;
  m.grew = u.grew;
  m.growth_tracker = u.growth_tracker;
  m.backoffs_in_row = u.guard.backoffs_in_row;
  m.collapsing = u.guard.collapsing;
  p.keeper = true;
  s_->release();
}

void Metrics::attached() {
  std::lock_guard<std::mutex> lock(s_->m);
  ++s_->pipelines;
}

void Metrics::detached() {
  std::lock_guard<std::mutex> lock(s_->m);
  --s_->pipelines;
  if (!s_->closed) s_->release();
}

void Metrics::trainer_step(std::int64_t k, double held_s, double iteration_s) {
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->closed) return;
  State::Pending& p = s_->at(k);
  // Several pipelines in one iteration: the trainer waited for each in turn.
  p.m.trainer_wait_s = p.trainer ? p.m.trainer_wait_s + held_s : held_s;
  if (!p.trainer) p.m.iteration_s = iteration_s;
  ++p.trainer;
  s_->release();
}

void Metrics::optimizer_step(std::int64_t k, double step_s, double grad_norm) {
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->closed) return;
  State::Pending& p = s_->at(k);
  p.m.optimizer_step_s = p.optimizer ? p.m.optimizer_step_s + step_s : step_s;
  if (grad_norm == grad_norm) p.m.grad_norm = grad_norm;
  ++p.optimizer;
  s_->release();
}

}  // namespace ampactor
