// PrometheusMetrics: prometheus-cpp's registry and text format, served by a small HTTP server of
// its own (metrics/http_endpoint.cpp); write() only sets atomics. Not prometheus-cpp's Exposer:
// Debian's civetweb under it starts its threads with a fixed small stack, which cannot hold the
// thread-local storage of a process with LibTorch and OpenBLAS (pthread_create fails with
// EINVAL, "Cannot create first worker thread").
#include <ampactor/metrics/prometheus.h>

#include <cmath>
#include <sstream>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <ampactor/core/errors.h>

#include "http_endpoint.h"

namespace ampactor {

struct PrometheusMetrics::State {
  std::unique_ptr<internal::HttpEndpoint> endpoint;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Counter *iterations, *skipped, *found_inf, *overflow_tensors, *wait, *step;
  prometheus::Gauge *iteration, *scale, *scale_used, *growth_tracker, *backoffs, *collapsing,
      *grad_norm, *last_wait, *last_step, *iteration_time;
};

PrometheusMetrics::PrometheusMetrics(const std::string& bind_address, const std::string& name)
    : s_(std::make_unique<State>()) {
  const prometheus::Labels labels{{"job_name", name}};
  auto counter = [&](const char* n, const char* help) {
    return &prometheus::BuildCounter().Name(n).Help(help).Register(*s_->registry).Add(labels);
  };
  auto gauge = [&](const char* n, const char* help) {
    return &prometheus::BuildGauge().Name(n).Help(help).Register(*s_->registry).Add(labels);
  };
  s_->iterations = counter("ampactor_iterations_total", "Iterations whose scale update applied");
  s_->skipped = counter("ampactor_skipped_steps_total", "Optimizer steps skipped for inf/NaN");
  s_->found_inf = counter("ampactor_found_inf_total", "Iterations whose gradients held inf/NaN");
  s_->overflow_tensors =
      counter("ampactor_overflow_tensors_total", "Gradients that held inf/NaN, summed");
  s_->wait = counter("ampactor_trainer_wait_seconds_total",
                     "Time step() held the trainer (waiting on the optimizer, its copies)");
  s_->step = counter("ampactor_optimizer_step_seconds_total",
                     "Time of the optimizer's steps on its thread");
  s_->iteration = gauge("ampactor_iteration", "The last iteration written");
  s_->scale = gauge("ampactor_loss_scale", "The loss scale after the last update");
  s_->scale_used = gauge("ampactor_loss_scale_used", "The scale the last iteration's loss had");
  s_->growth_tracker = gauge("ampactor_growth_tracker", "Clean steps in a row toward a growth");
  s_->backoffs = gauge("ampactor_backoffs_in_row", "Backoffs in a row (the collapse guard)");
  s_->collapsing = gauge("ampactor_scale_collapsing", "1 while the collapse guard has tripped");
  s_->grad_norm = gauge("ampactor_grad_norm", "The last measured total gradient norm");
  s_->last_wait = gauge("ampactor_trainer_wait_seconds", "The last iteration's trainer wait");
  s_->last_step = gauge("ampactor_optimizer_step_seconds", "The last iteration's step time");
  s_->iteration_time = gauge("ampactor_iteration_seconds", "The last iteration's time");
  try {
    std::weak_ptr<prometheus::Registry> registry = s_->registry;
    s_->endpoint = std::make_unique<internal::HttpEndpoint>(bind_address, [registry] {
      std::ostringstream out;
      if (const auto r = registry.lock()) prometheus::TextSerializer().Serialize(out, r->Collect());
      return out.str();
    });
  } catch (const std::exception& e) {
    throw ScalerError(errc::bad_option,
                      "PrometheusMetrics: cannot serve on " + bind_address + ": " + e.what());
  }
}

PrometheusMetrics::~PrometheusMetrics() = default;

void PrometheusMetrics::write(const IterationMetrics& m) {
  s_->iterations->Increment();
  if (m.skipped) s_->skipped->Increment();
  if (m.found_inf) s_->found_inf->Increment();
  s_->overflow_tensors->Increment(static_cast<double>(m.overflow.size()));
  s_->iteration->Set(static_cast<double>(m.k));
  s_->scale->Set(m.scale);
  s_->scale_used->Set(m.scale_used);
  s_->growth_tracker->Set(static_cast<double>(m.growth_tracker));
  s_->backoffs->Set(static_cast<double>(m.backoffs_in_row));
  s_->collapsing->Set(m.collapsing ? 1 : 0);
  // Not measured: the gauges keep their last value, the counters add nothing.
  if (!std::isnan(m.grad_norm)) s_->grad_norm->Set(m.grad_norm);
  if (!std::isnan(m.trainer_wait_s)) {
    s_->wait->Increment(m.trainer_wait_s);
    s_->last_wait->Set(m.trainer_wait_s);
  }
  if (!std::isnan(m.optimizer_step_s)) {
    s_->step->Increment(m.optimizer_step_s);
    s_->last_step->Set(m.optimizer_step_s);
  }
  if (!std::isnan(m.iteration_s)) s_->iteration_time->Set(m.iteration_s);
}

int PrometheusMetrics::port() const {
  return s_->endpoint->port();
}

}  // namespace ampactor
