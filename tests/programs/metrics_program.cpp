// ampactor-metrics-run: the metrics tests' short real run (tests/metrics/metrics_run.h) with
// the sinks asked for, for the checks by other programs: TensorBoard's own reader and a
// Prometheus server.
//   ampactor-metrics-run --iterations N [--staleness S] [--sleep-ms M] [--trace FILE]
//                        [--tensorboard DIR] [--jsonl FILE] [--prometheus HOST:PORT]
//                        [--port-file FILE]
#include <ampactor/keeper/taps.h>
#include <ampactor/metrics/metrics.h>
#include <ampactor/trace/trace.h>
#ifdef AMPACTOR_TENSORBOARD
#include <ampactor/metrics/tensorboard.h>
#endif
#ifdef AMPACTOR_PROMETHEUS
#include <ampactor/metrics/prometheus.h>
#endif

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "metrics_run.h"

int main(int argc, char** argv) try {
  int iterations = 10, staleness = 0, sleep_ms = 0;
  std::string trace, tensorboard, jsonl, prometheus, port_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "ampactor-metrics-run: " << a << " needs a value\n";
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--iterations")
      iterations = std::stoi(v);
    else if (a == "--staleness")
      staleness = std::stoi(v);
    else if (a == "--sleep-ms")
      sleep_ms = std::stoi(v);
    else if (a == "--trace")
      trace = v;
    else if (a == "--tensorboard")
      tensorboard = v;
    else if (a == "--jsonl")
      jsonl = v;
    else if (a == "--prometheus")
      prometheus = v;
    else if (a == "--port-file")
      port_file = v;
    else {
      std::cerr << "ampactor-metrics-run: unknown option " << a << "\n";
      return 2;
    }
  }
  auto metrics = std::make_shared<ampactor::Metrics>();
  if (!jsonl.empty()) metrics->sink(std::make_shared<ampactor::JsonlMetrics>(jsonl));
  if (!tensorboard.empty()) {
#ifdef AMPACTOR_TENSORBOARD
    metrics->sink(std::make_shared<ampactor::TensorBoardMetrics>(tensorboard));
#else
    std::cerr << "ampactor-metrics-run: the TensorBoard sink is not built\n";
    return 77;
#endif
  }
  if (!prometheus.empty()) {
#ifdef AMPACTOR_PROMETHEUS
    auto prom = std::make_shared<ampactor::PrometheusMetrics>(prometheus);
    metrics->sink(prom);
    if (!port_file.empty()) {
      std::ofstream(port_file + ".tmp") << prom->port() << "\n";
      std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    }
#else
    std::cerr << "ampactor-metrics-run: the Prometheus sink is not built\n";
    return 77;
#endif
  }
  std::shared_ptr<ampactor::KeeperTap> tap = metrics;
  if (!trace.empty()) tap = ampactor::tee_taps({ampactor::record_trace(trace), metrics});
  ampactor::test::metrics_run(iterations, staleness, tap, metrics, nullptr,
                              std::chrono::milliseconds(sleep_ms));
  std::cout << "ampactor-metrics-run: " << metrics->written() << " records\n";
  const std::string failure = metrics->failure();
  if (!failure.empty()) {
    std::cerr << "ampactor-metrics-run: " << failure << "\n";
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "ampactor-metrics-run: " << e.what() << "\n";
  return 1;
}
