// ampactor-bench-actors: what the actors cost, measured side by side in one run: the round trip
// of a ScaleRequest from the main thread to the scale_keeper (beside a bare CAF echo actor), the
// per-iteration overhead of the actor-backed GradScaler beside the thread-free LocalGradScaler on
// the same tiny workload, and the keeper's message throughput. Not a test: it reports figures and
// goals and never fails on them; it fails only when a measurement could not be trusted (an error
// reply, or a keeper that did not apply every update it was sent).
#include <ampactor/actors/scale_keeper.h>
#include <ampactor/grad_scaler.h>
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

namespace {

constexpr double kLatencyGoalUs = 20.0;   // median ScaleRequest round trip
constexpr double kOverheadGoalUs = 60.0;  // actor step() iteration minus LocalGradScaler's

/// The config every actor system of this benchmark uses: the one GradScaler gives itself.
struct BenchConfig : SystemConfig {
  BenchConfig() { scheduler_threads(2); }
};

std::string fixed(double v, int prec = 1) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(prec) << v;
  return s.str();
}

std::string cpu_model() {
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
double sleep_50us_median() {
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

Latency summarize(std::vector<double> us) {
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
float ask_scale(caf::scoped_actor& self, const Handle& dest, iteration_t k) {
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
caf::behavior echo_actor() {
  return {[](const ScaleRequest& r) { return ScaleReply{r.k, 1.0f}; }};
}

void print_latency(const std::string& label, const Latency& l) {
  std::cout << "  " << std::left << std::setw(60) << label << std::right << " median "
            << std::setw(7) << fixed(l.median_us) << " us   p99 " << std::setw(7) << fixed(l.p99_us)
            << " us   mean " << std::setw(7) << fixed(l.mean_us) << " us\n";
}

/// `n` round trips to each target, back to back, in `blocks` blocks whose target order rotates
/// (so drifts of the machine hit every target alike), after `warmup_s` seconds of untimed round
/// trips; then `n_spaced` to each with a `gap_us` pause before each (the receiver has gone idle,
/// as it has between a training loop's iterations).
json bench_latency(const GradScalerOptions& opts, int n, int blocks, double warmup_s, int n_spaced,
                   int gap_us, Latency& keeper_out) {
  std::cout << "\n[1. ScaleRequest round trips from the main thread (scoped_actor request()"
               ".receive()): "
            << n << " back to back per target in " << blocks << " interleaved blocks after "
            << warmup_s << " s of warm-up; " << n_spaced << " per target " << gap_us
            << " us apart]\n";
  BenchConfig cfg, cfg_sharing;
  cfg_sharing.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};
  caf::actor_system sys_sharing{cfg_sharing};
  json out = json::object();
  {
    caf::scoped_actor self{sys};
    auto keeper = spawn_scale_keeper(sys, opts, ScalePolicy::exact);
    // The keeper as GradScaler spawns it: a thread of its own.
    auto keeper_detached = spawn_scale_keeper(sys, opts, ScalePolicy::exact, /*detached=*/true);
    auto echo = sys.spawn(echo_actor);
    auto echo_detached = sys.spawn<caf::detached>(echo_actor);
    // The same keeper in an actor system whose workers wait on a condition variable (CAF's
    // work-sharing policy) instead of polling and sleeping (work stealing, the default).
    caf::scoped_actor self_sharing{sys_sharing};
    auto keeper_sharing = spawn_scale_keeper(sys_sharing, opts, ScalePolicy::exact);
    std::vector<Target> ts;
    ts.emplace_back(
        "keeper_detached", "scale_keeper (detached thread, as GradScaler spawns it)",
        [&](caf::scoped_actor& s, iteration_t k) { return ask_scale(s, keeper_detached, k); });
    ts.emplace_back("keeper_scheduled", "scale_keeper (work stealing, the default)",
                    [&](caf::scoped_actor& s, iteration_t k) { return ask_scale(s, keeper, k); });
    ts.emplace_back("keeper_sharing", "scale_keeper (work sharing)",
                    [&](caf::scoped_actor&, iteration_t k) {
                      return ask_scale(self_sharing, keeper_sharing, k);
                    });
    ts.emplace_back("echo_scheduled", "bare CAF echo actor (work stealing)",
                    [&](caf::scoped_actor& s, iteration_t k) { return ask_scale(s, echo, k); });
    ts.emplace_back(
        "echo_detached", "bare CAF echo actor (detached thread)",
        [&](caf::scoped_actor& s, iteration_t k) { return ask_scale(s, echo_detached, k); });

    iteration_t k = 0;
    const auto w0 = Clock::now();
    while (us_since(w0) < warmup_s * 1e6)
      for (Target& t : ts)
        for (int i = 0; i < 100; ++i)
          t.ask(self, k++);

    const int per_block = std::max(1, n / blocks);
    for (int b = 0; b < blocks; ++b)
      for (std::size_t j = 0; j < ts.size(); ++j) {
        Target& t = ts[(j + std::size_t(b)) % ts.size()];
        for (int i = 0; i < per_block; ++i) {
          const auto t0 = Clock::now();
          t.ask(self, k++);
          t.us.push_back(us_since(t0));
        }
      }
    for (int i = 0; i < n_spaced; ++i)
      for (Target& t : ts) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
        const auto t0 = Clock::now();
        t.ask(self, k++);
        t.spaced_us.push_back(us_since(t0));
      }

    for (Target& t : ts) {
      const Latency l = summarize(t.us);
      print_latency(t.label, l);
      out[t.key] = l.to_json();
      if (t.key == "keeper_detached") keeper_out = l;
    }
    for (Target& t : ts) {
      const Latency l = summarize(t.spaced_us);
      print_latency(t.label + ", " + std::to_string(gap_us) + " us apart", l);
      out[t.key + "_spaced"] = l.to_json();
    }
    out["spacing_us"] = gap_us;
    out["warmup_seconds"] = warmup_s;
    out["blocks"] = blocks;

    caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(keeper_detached, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(keeper_sharing, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(echo_detached, caf::exit_reason::user_shutdown);
  }  // handles and the scoped actor go before the system
  return out;
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
void settle(int ms) {
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
void step_loop(Scaler& s, Tiny& m, const at::Tensor& one, int n, M& marks) {
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
void submit_loop(GradScaler& s, Tiny& m, const at::Tensor& one, int n, M& marks) {
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

json bench_overhead(const GradScalerOptions& opts, int rounds, int iters, int settle_ms,
                    double& overhead_out) {
  std::cout << "\n[2. per-iteration cost on a tiny workload: fp32 params of 256 and 16x16, SGD; "
            << rounds << " rounds x " << iters << " iterations, variants interleaved, " << settle_ms
            << " ms pause before each]\n";
  const std::vector<at::Tensor> init{at::randn({256}), at::randn({16, 16})};
  const std::vector<at::Tensor> grads{at::randn({256}) * 1000, at::randn({16, 16}) * 1000};
  const at::Tensor one = at::ones({1});

  // A system of our own for the work-sharing variant: it must outlive its scaler.
  BenchConfig cfg_sharing;
  cfg_sharing.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys_sharing{cfg_sharing};

  Tiny m_local(init, grads), m_step(init, grads), m_sharing(init, grads), m_submit(init, grads),
      m_lagged(init, grads);
  LocalGradScaler local(opts);
  GradScaler actor_step(opts);  // each owns its own actor system, as a default GradScaler does
  GradScaler actor_sharing(sys_sharing, opts);
  GradScaler actor_submit(opts);
  GradScaler actor_lagged(opts, ScalePolicy::lagged);

  // Each variant's loop, untimed (marks == nullptr) or with phase marks.
  auto with_marks = [](auto&& body) {
    return [body](int n, Marks* marks) {
      if (marks) {
        body(n, *marks);
      } else {
        NoMarks none;
        body(n, none);
      }
    };
  };
  std::vector<Variant> vs;
  vs.emplace_back("local", "LocalGradScaler (no threads)", kStepPhases,
                  with_marks([&](int n, auto& mk) { step_loop(local, m_local, one, n, mk); }));
  vs.emplace_back("actor_step", "GradScaler step() (exact)", kStepPhases,
                  with_marks([&](int n, auto& mk) { step_loop(actor_step, m_step, one, n, mk); }));
  vs.emplace_back(
      "actor_step_sharing", "GradScaler step(), work-sharing system", kStepPhases,
      with_marks([&](int n, auto& mk) { step_loop(actor_sharing, m_sharing, one, n, mk); }));
  vs.emplace_back(
      "actor_submit", "GradScaler submit() (exact)", kSubmitPhases,
      with_marks([&](int n, auto& mk) { submit_loop(actor_submit, m_submit, one, n, mk); }));
  vs.emplace_back(
      "actor_submit_lagged", "GradScaler submit() (lagged)", kSubmitPhases,
      with_marks([&](int n, auto& mk) { submit_loop(actor_lagged, m_lagged, one, n, mk); }));

  for (Variant& v : vs)
    v.loop(std::max(1, iters / 5), nullptr);  // warm-up: allocations, first scale, threads awake
  for (int r = 0; r < rounds; ++r) {
    // Rotate the order each round, so no variant always runs right after the same other one.
    for (std::size_t j = 0; j < vs.size(); ++j) {
      Variant& v = vs[(j + std::size_t(r)) % vs.size()];
      settle(settle_ms);
      const auto t0 = Clock::now();
      v.loop(iters, nullptr);
      v.per_iter_us.push_back(us_since(t0) / iters);
    }
    // Where the time goes: half as many iterations again, with a clock read between the calls.
    for (std::size_t j = 0; j < vs.size(); ++j) {
      Variant& v = vs[(j + std::size_t(r)) % vs.size()];
      settle(settle_ms);
      Marks marks(v.phase_names.size());
      v.loop(std::max(1, iters / 2), &marks);
      for (std::size_t i = 0; i < marks.us.size(); ++i)
        v.phase_us[i].insert(v.phase_us[i].end(), marks.us[i].begin(), marks.us[i].end());
    }
    std::cout << "  round " << std::setw(2) << r + 1 << ":";
    for (const Variant& v : vs)
      std::cout << "  " << v.key << " " << fixed(v.per_iter_us.back());
    std::cout << " us\n";
  }
  for (Variant& v : vs)
    for (auto& p : v.phase_us)
      v.phase_median_us.push_back(median_of(p));

  json out = json::object();
  for (Variant& v : vs) {
    v.median_us = median_of(v.per_iter_us);
    json phases = json::object();
    for (std::size_t i = 0; i < v.phase_names.size(); ++i)
      phases[v.phase_names[i]] = v.phase_median_us[i];
    out[v.key] = {
        {"label", v.label},
        {"median_us_per_iteration", v.median_us},
        {"min_us_per_iteration", *std::min_element(v.per_iter_us.begin(), v.per_iter_us.end())},
        {"rounds_us_per_iteration", v.per_iter_us},
        {"phase_median_us", phases}};
  }
  const double base = vs[0].median_us;
  std::cout
      << "  medians over rounds; below each, the median of each call in the instrumented passes:\n";
  for (const Variant& v : vs) {
    std::cout << "    " << std::left << std::setw(40) << v.label << std::right << std::setw(7)
              << fixed(v.median_us) << " us/iteration";
    if (&v != &vs[0])
      std::cout << "  (+" << fixed(v.median_us - base) << " us, " << fixed(v.median_us / base, 2)
                << "x)";
    std::cout << "\n      ";
    for (std::size_t i = 0; i < v.phase_names.size(); ++i)
      std::cout << v.phase_names[i] << " " << fixed(v.phase_median_us[i]) << " us  ";
    std::cout << "\n";
    if (&v != &vs[0]) {
      out[v.key]["overhead_us"] = v.median_us - base;
      out[v.key]["ratio_vs_local"] = v.median_us / base;
    }
  }
  overhead_out = vs[1].median_us - base;
  // Every scaler saw the same gradients (no overflow) the same number of times, so their scales
  // must agree: a cheap check that each loop really ran its iterations.
  const double s_local = local.get_scale();
  out["final_scale"] = s_local;
  for (GradScaler* s : {&actor_step, &actor_sharing, &actor_submit, &actor_lagged})
    if (s->get_scale() != s_local)
      throw std::runtime_error("the scalers ended with different scales: " +
                               std::to_string(s->get_scale()) + " vs " + std::to_string(s_local));
  out["rounds"] = rounds;
  out["iterations_per_round"] = iters;
  return out;
}

// ---------------------------------------------------------------------------------------------
// 3. Keeper throughput

json bench_throughput(const GradScalerOptions& opts, int n, int reps) {
  std::cout << "\n[3. keeper throughput: " << n << " x (UnscaleDone + UpdateScale) by anon_send "
            << "from the main thread, then GetParams{up_to_date}; " << reps << " repetitions]\n";
  BenchConfig cfg;
  caf::actor_system sys{cfg};
  std::vector<double> rates, send_rates;
  {
    caf::scoped_actor self{sys};
    for (int rep = 0; rep < reps; ++rep) {
      auto keeper = spawn_scale_keeper(sys, opts, ScalePolicy::exact);
      const float scale = ask_scale(self, keeper, 0);  // the keeper is up and initialized
      const auto t0 = Clock::now();
      for (iteration_t k = 0; k < n; ++k) {
        caf::anon_send(keeper, UnscaleDone{k, 1, false, scale});
        caf::anon_send(keeper, UpdateScale{k, 1});
      }
      const double send_us = us_since(t0);
      ScaleParams p;
      caf::error err;
      self->request(keeper, caf::infinite, GetParams{true})
          .receive([&](const ScaleParams& r) { p = r; }, [&](caf::error& e) { err = e; });
      const double total_us = us_since(t0);
      if (err)
        throw std::runtime_error("GetParams failed: " + std::string(to_exception(err).what()));
      if (p.applied_through != n - 1)
        throw std::runtime_error("keeper applied updates through " +
                                 std::to_string(p.applied_through) + ", expected " +
                                 std::to_string(n - 1));
      rates.push_back(2.0 * n / (total_us * 1e-6));
      send_rates.push_back(2.0 * n / (send_us * 1e-6));
      std::cout << "  rep " << rep + 1 << ": " << fixed(rates.back() / 1e6, 2)
                << " M messages/s through the keeper (sending alone: "
                << fixed(send_rates.back() / 1e6, 2) << " M/s); applied_through "
                << p.applied_through << ", scale " << p.scale << "\n";
      caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    }
  }
  const double rate = median_of(rates);
  std::cout << "  median: " << fixed(rate / 1e6, 2) << " M messages/s (" << fixed(rate / 2 / 1e6, 2)
            << " M updates/s)\n";
  return {{"iterations", n},
          {"messages_per_iteration", 2},
          {"messages_per_second", rate},
          {"updates_per_second", rate / 2},
          {"send_only_messages_per_second", median_of(send_rates)},
          {"reps_messages_per_second", rates},
          {"applied_through_checked", true}};
}

// ---------------------------------------------------------------------------------------------
// 4. Trace recording: on vs off, side by side

json bench_trace(const GradScalerOptions& opts, int rounds, int iters, int settle_ms, int n,
                 int reps) {
  namespace fs = std::filesystem;
  std::cout << "\n[4. trace recording (JSON Lines to a file), on vs off: the keeper's time for "
            << n << " x (UnscaleDone + UpdateScale), " << reps
            << " repetitions; and the GradScaler "
            << "loops, " << rounds << " rounds x " << iters << " iterations, interleaved]\n";
  const fs::path dir =
      fs::temp_directory_path() / ("ampactor-bench-trace-" + std::to_string(getpid()));
  fs::create_directories(dir);
  json out = json::object();

  // (a) The keeper alone: each iteration records 3 events (2 inputs and UpdateApplied).
  BenchConfig cfg;
  caf::actor_system sys{cfg};
  std::vector<double> off_us, on_us;
  std::uintmax_t bytes = 0;
  {
    caf::scoped_actor self{sys};
    for (int rep = 0; rep < reps; ++rep) {
      for (bool on : {false, true}) {
        const fs::path file = dir / "blast.jsonl";
        std::shared_ptr<TraceRecorder> sink;
        if (on) sink = record_trace(file.string());
        auto keeper = spawn_scale_keeper(sys, opts, ScalePolicy::exact, true, sink);
        const float scale = ask_scale(self, keeper, 0);
        const auto t0 = Clock::now();
        for (iteration_t k = 0; k < n; ++k) {
          caf::anon_send(keeper, UnscaleDone{k, 1, false, scale});
          caf::anon_send(keeper, UpdateScale{k, 1});
        }
        ScaleParams p;
        self->request(keeper, caf::infinite, GetParams{true})
            .receive([&](const ScaleParams& r) { p = r; }, [&](caf::error&) {});
        const double us = us_since(t0) / n;
        if (p.applied_through != n - 1)
          throw std::runtime_error("trace bench: the keeper applied updates through " +
                                   std::to_string(p.applied_through));
        caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
        self->wait_for(keeper);
        if (sink) {
          // The keeper's exit closed the file (the recorder's stopped()).
          if (!static_cast<TraceFile&>(*sink->sink()).ok())
            throw std::runtime_error("trace bench: writing the trace failed");
          bytes = fs::file_size(file);
          fs::remove(file);
        }
        (on ? on_us : off_us).push_back(us);
      }
      std::cout << "  rep " << rep + 1 << ": keeper " << fixed(off_us.back(), 3)
                << " us/iteration off, " << fixed(on_us.back(), 3) << " on\n";
    }
  }
  const double keeper_off = median_of(off_us), keeper_on = median_of(on_us);
  std::cout << "  keeper median: " << fixed(keeper_off, 3) << " us/iteration off, "
            << fixed(keeper_on, 3) << " on (+" << fixed(keeper_on - keeper_off, 3) << " us, "
            << fixed(double(bytes) / n, 0) << " bytes/iteration)\n";
  out["keeper"] = {{"iterations", n},
                   {"events_per_iteration", 3},
                   {"off_us_per_iteration", keeper_off},
                   {"on_us_per_iteration", keeper_on},
                   {"recording_us_per_iteration", keeper_on - keeper_off},
                   {"bytes_per_iteration", double(bytes) / n},
                   {"reps_off_us", off_us},
                   {"reps_on_us", on_us}};

  // (b) The GradScaler loops of section 2, trace off and on, interleaved.
  const std::vector<at::Tensor> init{at::randn({256}), at::randn({16, 16})};
  const std::vector<at::Tensor> grads{at::randn({256}) * 1000, at::randn({16, 16}) * 1000};
  const at::Tensor one = at::ones({1});
  const std::string step_trace = (dir / "step.jsonl").string();
  const std::string submit_trace = (dir / "submit.jsonl").string();
  struct Loop {
    std::string key;
    std::function<void(int)> run;
    std::vector<double> us;
  };
  {
    Tiny m_step_off(init, grads), m_step_on(init, grads), m_sub_off(init, grads),
        m_sub_on(init, grads);
    GradScaler step_off(opts), step_on(opts, ScalePolicy::exact, record_trace(step_trace));
    GradScaler sub_off(opts), sub_on(opts, ScalePolicy::exact, record_trace(submit_trace));
    NoMarks none;
    std::vector<Loop> loops;
    loops.push_back(
        {"step_off", [&](int k) { step_loop(step_off, m_step_off, one, k, none); }, {}});
    loops.push_back({"step_on", [&](int k) { step_loop(step_on, m_step_on, one, k, none); }, {}});
    loops.push_back(
        {"submit_off", [&](int k) { submit_loop(sub_off, m_sub_off, one, k, none); }, {}});
    loops.push_back({"submit_on", [&](int k) { submit_loop(sub_on, m_sub_on, one, k, none); }, {}});
    for (auto& l : loops)
      l.run(std::max(1, iters / 5));
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t j = 0; j < loops.size(); ++j) {
        Loop& l = loops[(j + std::size_t(r)) % loops.size()];
        settle(settle_ms);
        const auto t0 = Clock::now();
        l.run(iters);
        l.us.push_back(us_since(t0) / iters);
      }
    }
    for (auto& l : loops)
      out[l.key + "_us_per_iteration"] = median_of(l.us);
    for (const char* v : {"step", "submit"}) {
      const double off = out[std::string(v) + "_off_us_per_iteration"];
      const double on = out[std::string(v) + "_on_us_per_iteration"];
      std::cout << "  GradScaler " << std::left << std::setw(8) << v << std::right << fixed(off)
                << " us/iteration off, " << fixed(on) << " on (" << (on >= off ? "+" : "")
                << fixed(on - off) << " us)\n";
      out[std::string(v) + "_recording_us_per_iteration"] = on - off;
    }
  }
  // The recorded run must replay bit for bit, or the figures measured a broken recorder.
  const auto t0 = Clock::now();
  const Trace t = read_trace(step_trace);
  const ReplayResult rr = replay_trace(t);
  if (!rr.identical)
    throw std::runtime_error("trace bench: the recorded run did not replay (line " +
                             std::to_string(rr.line) + ")");
  const double replay_ms = us_since(t0) / 1000;
  std::cout << "  the step() trace (" << t.events.size() << " events) read and replayed "
            << "identically in " << fixed(replay_ms, 0) << " ms\n";
  out["replay"] = {{"events", t.events.size()}, {"read_and_replay_ms", replay_ms}};
  out["rounds"] = rounds;
  out["iterations_per_round"] = iters;
  bench::remove_tree(dir.string());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ampactor-bench-actors: keeper round trips, actor scaler overhead, keeper throughput"};
  int requests = 20000;
  int spaced = 300;
  int gap_us = 2000;
  int blocks = 10;
  double warmup_s = 1.0;
  int rounds = 10;
  int settle_ms = 60;
  int iters = 500;
  int messages = 200000;
  int reps = 3;
  std::string json_path;
  bool quick = false;
  app.add_option("--requests", requests, "timed back-to-back ScaleRequest round trips")
      ->check(CLI::Range(10, 10000000));
  app.add_option("--spaced", spaced, "timed round trips with a pause before each")
      ->check(CLI::Range(10, 100000));
  app.add_option("--gap-us", gap_us, "the pause before each spaced round trip, microseconds")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--blocks", blocks, "interleaved blocks of the back-to-back round trips")
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup-seconds", warmup_s, "untimed round trips before the timed ones")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", rounds, "interleaved rounds of the scaler loops")
      ->check(CLI::Range(1, 1000));
  app.add_option("--settle-ms", settle_ms, "pause before each timed loop, milliseconds")
      ->check(CLI::Range(0, 10000));
  app.add_option("--iterations", iters, "iterations per round and scaler loop")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--messages", messages, "iterations (2 messages each) of the throughput blast")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--reps", reps, "repetitions of the throughput blast")->check(CLI::Range(1, 100));
  app.add_option("--json", json_path, "write the figures as JSON to this file");
  app.add_flag("--quick", quick, "few requests, rounds and messages (a smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    requests = 2000;
    spaced = 30;
    warmup_s = 0.2;
    rounds = 3;
    iters = 100;
    messages = 20000;
    reps = 1;
  }
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);
    if (!json_file) {
      std::cerr << "--json: cannot write " << json_path << "\n";
      return 2;
    }
  }

  const unsigned hw = std::thread::hardware_concurrency();
  const std::string caf_version = std::to_string(CAF_MAJOR_VERSION) + "." +
                                  std::to_string(CAF_MINOR_VERSION) + "." +
                                  std::to_string(CAF_PATCH_VERSION);
  std::cout << "ampactor-bench-actors: " << hw << " hardware thread(s) (" << cpu_model()
            << "), CAF " << caf_version << ", LibTorch " << TORCH_VERSION
            << ", torch intra-op threads " << at::get_num_threads()
            << ", scheduler.max-threads 2 in every actor system\n";
  const double sleep50 = sleep_50us_median();
  std::cout << "sleep_for(50 us) takes " << fixed(sleep50) << " us (median)\n";

  const GradScalerOptions opts;  // torch's defaults
  json res = json::object();
  res["machine"] = {{"hardware_concurrency", hw},
                    {"cpu", cpu_model()},
                    {"caf_version", caf_version},
                    {"libtorch_version", TORCH_VERSION},
                    {"torch_intra_op_threads", at::get_num_threads()},
                    {"scheduler_max_threads", 2},
                    {"sleep_for_50us_median_us", sleep50}};
  res["quick"] = quick;
  try {
    Latency keeper;
    double overhead = 0;
    res["latency"] = bench_latency(opts, requests, blocks, warmup_s, spaced, gap_us, keeper);
    res["overhead"] = bench_overhead(opts, rounds, iters, settle_ms, overhead);
    res["throughput"] = bench_throughput(opts, messages, reps);
    res["trace"] = bench_trace(opts, rounds, iters, settle_ms, std::min(messages, 50000), reps);

    const auto& o = res["overhead"];
    const double rate = res["throughput"]["messages_per_second"];
    res["goals"] = {
        {"latency_median_us",
         {{"measured", keeper.median_us},
          {"goal_max", kLatencyGoalUs},
          {"met", keeper.median_us <= kLatencyGoalUs}}},
        {"overhead_us_per_iteration",
         {{"measured", overhead},
          {"goal_max", kOverheadGoalUs},
          {"met", overhead <= kOverheadGoalUs}}},
    };

    std::cout << "\nSummary\n";
    auto line = [](const std::string& what, const std::string& value, const std::string& note) {
      std::cout << "  " << std::left << std::setw(48) << what << std::setw(26) << value << note
                << std::right << "\n";
    };
    auto verdict = [](bool met) { return met ? std::string("met") : std::string("NOT met"); };
    auto lat = [&](const char* key) {
      const auto& l = res["latency"][key];
      return fixed(l["median_us"].get<double>()) + " / " + fixed(l["p99_us"].get<double>()) +
             " / " + fixed(l["mean_us"].get<double>()) + " us";
    };
    auto per_iter = [&](const char* key) {
      return fixed(o[key]["median_us_per_iteration"].get<double>()) + " us";
    };
    auto over = [&](const char* key) {
      return "+" + fixed(o[key]["overhead_us"].get<double>()) + " us, " +
             fixed(o[key]["ratio_vs_local"].get<double>(), 2) + "x";
    };
    line("round trip, median / p99 / mean:", "", "");
    line("  scale_keeper (detached, as in GradScaler)", lat("keeper_detached"),
         "goal median <= " + fixed(kLatencyGoalUs, 0) +
             " us: " + verdict(keeper.median_us <= kLatencyGoalUs));
    line("  scale_keeper (work stealing, CAF default)", lat("keeper_scheduled"), "");
    line("  scale_keeper (work sharing)", lat("keeper_sharing"), "");
    line("  bare echo (work stealing)", lat("echo_scheduled"), "");
    line("  bare echo (detached)", lat("echo_detached"), "");
    line("  scale_keeper (work stealing), spaced", lat("keeper_scheduled_spaced"), "");
    line("per iteration (median over rounds):", "", "");
    line("  LocalGradScaler", per_iter("local"), "");
    line("  GradScaler step()", per_iter("actor_step"),
         over("actor_step") + "; goal overhead <= " + fixed(kOverheadGoalUs, 0) +
             " us: " + verdict(overhead <= kOverheadGoalUs));
    line("  GradScaler step(), work-sharing system", per_iter("actor_step_sharing"),
         over("actor_step_sharing"));
    line("  GradScaler submit() (exact)", per_iter("actor_submit"), over("actor_submit"));
    line("  GradScaler submit() (lagged)", per_iter("actor_submit_lagged"),
         over("actor_submit_lagged"));
    line("keeper throughput", fixed(rate / 1e6, 2) + " M messages/s",
         fixed(rate / 2e6, 2) + " M updates/s");
    const auto& tr = res["trace"];
    line("trace recording, keeper per iteration",
         "+" + fixed(tr["keeper"]["recording_us_per_iteration"].get<double>(), 3) + " us",
         fixed(tr["keeper"]["bytes_per_iteration"].get<double>(), 0) + " bytes/iteration");
    line("trace recording, GradScaler step() per iteration",
         fixed(tr["step_recording_us_per_iteration"].get<double>()) + " us", "");
    line("trace recording, GradScaler submit() per iteration",
         fixed(tr["submit_recording_us_per_iteration"].get<double>()) + " us", "");
  } catch (const std::exception& e) {
    std::cerr << "ampactor-bench-actors: " << e.what() << "\n";
    return 1;
  }
  if (!json_path.empty()) {
    json_file << std::setw(2) << res << "\n";
    std::cout << "\nwrote " << json_path << "\n";
  }
  return 0;
}
