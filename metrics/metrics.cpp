// Metrics: the join of the keeper's and the pipelines' reports into one record per iteration.
#include <ampactor/metrics/metrics.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include <ampactor/core/errors.h>

namespace ampactor {

MetricsOptions& MetricsOptions::max_pending(std::int64_t v) {
  if (v < 1)
    throw ScalerError(errc::bad_option,
                      "MetricsOptions: max_pending must be >= 1, got " + std::to_string(v));
  max_pending_ = v;
  return *this;
}

Metrics::Metrics(MetricsOptions options) : options_(std::move(options)) {}

Metrics::~Metrics() {
  close();
}

Metrics& Metrics::sink(std::shared_ptr<MetricsSink> s) {
  if (!s) throw ScalerError(errc::bad_option, "Metrics::sink: the sink is null");
  std::lock_guard<std::mutex> lock(m_);
  sinks_.push_back(std::move(s));
  dropped_.emplace_back();
  return *this;
}

Metrics::Pending& Metrics::at(iteration_t k) {
  newest_ = std::max(newest_, k);
  auto [it, made] = pending_.try_emplace(k);
  if (made) it->second.m.k = k;
  return it->second;
}

void Metrics::write(IterationMetrics& m) {
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (!dropped_[i].empty()) continue;
    try {
      sinks_[i]->write(m);
    } catch (const std::exception& e) {
      dropped_[i] = std::string("metrics sink dropped: ") + e.what();
      std::cerr << "ampactor: " << dropped_[i] << "\n";
    }
  }
  ++written_;
}

void Metrics::release() {
  while (!pending_.empty()) {
    auto it = pending_.begin();
    Pending& p = it->second;
    const bool whole = p.keeper && p.trainer >= pipelines_ && p.optimizer >= pipelines_;
    const bool aged = newest_ - it->first >= options_.max_pending();
    if (!whole && !aged && !closed_) return;
    p.m.complete = whole;
    if (!p.keeper)
      p.m.wall_time =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
    write(p.m);
    pending_.erase(it);
  }
}

void Metrics::close() {
  std::lock_guard<std::mutex> lock(m_);
  if (closed_) return;
  closed_ = true;
  release();
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (!dropped_[i].empty()) continue;
    try {
      sinks_[i]->close();
    } catch (const std::exception& e) {
      dropped_[i] = std::string("metrics sink dropped at close: ") + e.what();
      std::cerr << "ampactor: " << dropped_[i] << "\n";
    }
  }
}

std::int64_t Metrics::written() const {
  std::lock_guard<std::mutex> lock(m_);
  return written_;
}

std::string Metrics::failure() const {
  std::lock_guard<std::mutex> lock(m_);
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (!dropped_[i].empty()) return dropped_[i];
    std::string f = sinks_[i]->failure();
    if (!f.empty()) return f;
  }
  return {};
}

void Metrics::started(const GradScalerOptions&, ScalePolicy) {}

void Metrics::input(peer_id, const KeeperInput& in) {
  const auto* d = std::get_if<UnscaleDone>(&in);
  if (!d) return;
  std::lock_guard<std::mutex> lock(m_);
  if (closed_) return;
  IterationMetrics& m = at(d->k).m;
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
    std::lock_guard<std::mutex> lock(m_);
    if (closed_) return;
    IterationMetrics& m = at(s->k).m;
    if (m.scale_used == 0) m.scale_used = s->scale;  // an unscale report says it too, and wins
    return;
  }
  const UpdateApplied& u = std::get<KeeperPush>(out).msg;
  std::lock_guard<std::mutex> lock(m_);
  if (closed_) return;
  Pending& p = at(u.k);
  IterationMetrics& m = p.m;
  m.wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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
  release();
}

void Metrics::attached() {
  std::lock_guard<std::mutex> lock(m_);
  ++pipelines_;
}

void Metrics::detached() {
  std::lock_guard<std::mutex> lock(m_);
  --pipelines_;
  if (!closed_) release();
}

void Metrics::trainer_step(std::int64_t k, double held_s, double iteration_s) {
  std::lock_guard<std::mutex> lock(m_);
  if (closed_) return;
  Pending& p = at(k);
  // Several pipelines in one iteration: the trainer waited for each in turn.
  p.m.trainer_wait_s = p.trainer ? p.m.trainer_wait_s + held_s : held_s;
  if (!p.trainer) p.m.iteration_s = iteration_s;
  ++p.trainer;
  release();
}

void Metrics::optimizer_step(std::int64_t k, double step_s, double grad_norm) {
  std::lock_guard<std::mutex> lock(m_);
  if (closed_) return;
  Pending& p = at(k);
  p.m.optimizer_step_s = p.optimizer ? p.m.optimizer_step_s + step_s : step_s;
  if (grad_norm == grad_norm) p.m.grad_norm = grad_norm;
  ++p.optimizer;
  release();
}

}  // namespace ampactor
