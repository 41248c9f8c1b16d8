// What the sections of ampactor-bench-actors share: includes, the actor system config,
// formatting, the round-trip helpers and the tiny workload.
#pragma once
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/scale_keeper.h>
#include <ampactor/messages/messages.h>
#include <ampactor/messages/registry.h>
#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <ampactor/messages/config.h>
#include <caf/actor_system.hpp>

#include <caf/actor_system_config.hpp>
#include <caf/config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace ampactor;
using ampactor::bench::Clock;
using ampactor::bench::median_of;
using ampactor::bench::us_since;
using nlohmann::json;

namespace ampactor::bench::actors {

constexpr double kLatencyGoalUs = 20.0;   // median ScaleRequest round trip
constexpr double kOverheadGoalUs = 60.0;  // actor step() iteration minus LocalGradScaler's

/// The config every actor system of this benchmark uses: the one GradScaler gives itself.
struct BenchConfig : SystemConfig {
  BenchConfig() { scheduler_threads(2); }
};

inline std::string fixed(double v, int prec = 1) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

/// What std::this_thread::sleep_for(50 us) really takes here: CAF's work-stealing workers sleep
/// that long between polls once they have been idle for a moment, so it bounds how late they
/// notice a message.
inline double sleep_50us_median() {
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    us.push_back(us_since(t0));
  }
  return median_of(us);
}

// ---------------------------------------------------------------------------------------------
// 1. ScaleRequest round trips

struct Latency {
  std::size_t count = 0;
  double median_us = 0, p99_us = 0, mean_us = 0, min_us = 0, max_us = 0;
  json to_json() const {
    return {{"count", count},     {"median_us", median_us}, {"p99_us", p99_us},
            {"mean_us", mean_us}, {"min_us", min_us},       {"max_us", max_us}};
  }
};

inline Latency summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Latency out;
  out.count = us.size();
  out.median_us = median_of(us);
  const std::size_t p99 = std::size_t(std::ceil(0.99 * double(us.size())));
  out.p99_us = us[std::min(us.size() - 1, p99 == 0 ? 0 : p99 - 1)];
  double sum = 0;
  for (double x : us)
    sum += x;
  out.mean_us = sum / double(us.size());
  out.min_us = us.front();
  out.max_us = us.back();
  return out;
}

/// One ScaleRequest round trip, the way GradScaler's scale() makes it. Returns the scale.
template <class Handle>
inline float ask_scale(caf::scoped_actor& self, const Handle& dest, iteration_t k) {
  float scale = 0;
  caf::error err;
  self->request(dest, caf::infinite, ScaleRequest{k})
      .receive([&](const ScaleReply& r) { scale = r.scale; },
               [&](caf::error& e) { err = std::move(e); });
  if (err)
    throw std::runtime_error("ScaleRequest failed: " + std::string(to_exception(err).what()));
  return scale;
}

/// Where ScaleRequests go: the keeper, or a bare actor that answers like it.
struct Target {
  Target(std::string k, std::string l, std::function<float(caf::scoped_actor&, iteration_t)> a)
      : key(std::move(k)), label(std::move(l)), ask(std::move(a)) {}
  std::string key, label;
  std::function<float(caf::scoped_actor&, iteration_t)> ask;
  std::vector<double> us, spaced_us;
};

/// A bare CAF actor that answers a ScaleRequest at once: the floor of any round trip.
inline caf::behavior echo_actor() {
  return {[](const ScaleRequest& r) { return ScaleReply{r.k, 1.0f}; }};
}

// ---------------------------------------------------------------------------------------------
// 2. Per-iteration overhead on a tiny workload

/// Two fp32 parameters, SGD over them, and the (already scaled) gradients each iteration gets.
struct Tiny {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;
  std::unique_ptr<torch::optim::SGD> opt;

  Tiny(const std::vector<at::Tensor>& init, const std::vector<at::Tensor>& g) : grads(g) {
    for (const at::Tensor& t : init)
      params.push_back(t.clone().set_requires_grad(true));
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-3));
  }
  void set_grads() {
    for (std::size_t i = 0; i < params.size(); ++i) {
      at::Tensor& g = params[i].mutable_grad();
      if (g.defined())
        g.copy_(grads[i]);
      else
        g = grads[i].clone();
    }
  }
};

/// Lets the worker threads of the loop that ran last go to sleep: CAF's work-stealing workers
/// poll, then sleep 50 us at a time for about 500 attempts before they wait on a condition
/// variable, and on 2 cores that polling would slow whichever loop runs next.
inline void settle(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

/// Phase timers for the instrumented pass: mark(i) books the time since the last mark to phase i.
struct Marks {
  std::vector<std::vector<double>> us;
  Clock::time_point t;
  explicit Marks(std::size_t phases = 0) : us(phases) {}
  void start() { t = Clock::now(); }
  void mark(std::size_t phase) {
    const auto now = Clock::now();
    us[phase].push_back(std::chrono::duration<double, std::micro>(now - t).count());
    t = now;
  }
};
/// The timed loops use this one: no clock reads.
struct NoMarks {
  void start() {}
  void mark(std::size_t) {}
};

const std::vector<std::string> kStepPhases{"scale", "set_grads", "step", "update"};
const std::vector<std::string> kSubmitPhases{"scale", "submit", "update"};

/// torch's loop: the same code for LocalGradScaler and GradScaler.
template <class Scaler, class M>
inline void step_loop(Scaler& s, Tiny& m, const at::Tensor& one, int n, M& marks) {
  for (int i = 0; i < n; ++i) {
    marks.start();
    s.scale(one);
    marks.mark(0);
    m.set_grads();
    marks.mark(1);
    s.step(*m.opt);
    marks.mark(2);
    s.update();
    marks.mark(3);
  }
}

/// The asynchronous loop: gradients are set and the step made inside the job, on the optimizer
/// thread. Returns once every job has run (sync).
template <class M>
inline void submit_loop(GradScaler& s, Tiny& m, const at::Tensor& one, int n, M& marks) {
  for (int i = 0; i < n; ++i) {
    marks.start();
    s.scale(one);
    marks.mark(0);
    s.submit([&s, &m] {
      m.set_grads();
      s.step(*m.opt);
    });
    marks.mark(1);
    s.update();
    marks.mark(2);
  }
  s.sync();
}

/// One way of running the training loop: loop(n, nullptr) does n iterations (timed as a whole by
/// the caller); loop(n, &marks) does n with a clock read between the calls.
struct Variant {
  Variant(std::string k, std::string l, std::vector<std::string> names,
          std::function<void(int, Marks*)> r)
      : key(std::move(k)),
        label(std::move(l)),
        phase_names(std::move(names)),
        loop(std::move(r)),
        phase_us(phase_names.size()) {}
  std::string key, label;
  std::vector<std::string> phase_names;
  std::function<void(int, Marks*)> loop;  // null Marks: the untimed loop
  std::vector<double> per_iter_us;        // one per round
  double median_us = 0;
  std::vector<std::vector<double>> phase_us;  // every instrumented call, by phase
  std::vector<double> phase_median_us;
};

/// The sections, each in its own file; each prints its figures and returns them as JSON.
json bench_latency(const GradScalerOptions& opts, int n, int blocks, double warmup_s, int n_spaced,
                   int gap_us, Latency& keeper_out);
json bench_overhead(const GradScalerOptions& opts, int rounds, int iters, int settle_ms,
                    double& overhead_out);
json bench_throughput(const GradScalerOptions& opts, int n, int reps);
json bench_trace(const GradScalerOptions& opts, int rounds, int iters, int settle_ms, int n,
                 int reps);

}  // namespace ampactor::bench::actors
