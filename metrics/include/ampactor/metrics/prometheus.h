// A metrics sink that serves the run's figures on a Prometheus endpoint (GET /metrics), for a
// training service watched as any other: counters of iterations, skips and overflowing tensors,
// gauges of the scale, the growth tracker, the collapse guard, the gradient norm and the last
// iteration's times (doc/guide/metrics.md). Built where prometheus-cpp is (Debian's
// prometheus-cpp-dev): ampactor::metrics_prometheus.
#pragma once

#include <memory>
#include <string>

#include <ampactor/metrics/metrics.h>

namespace ampactor {

class PrometheusMetrics final : public MetricsSink {
 public:
  /// Serves on `bind_address` ("host:port"; port 0 picks a free one, see port()). Every series
  /// carries the label job_name=<name>, so that several runs can share one Prometheus. A busy
  /// or bad address: ScalerError(errc::bad_option).
  explicit PrometheusMetrics(const std::string& bind_address, const std::string& name = "ampactor");
  ~PrometheusMetrics() override;
  void write(const IterationMetrics& m) override;
  /// The port it listens on.
  int port() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ampactor
