// ampactor-bench-actors, sections 3 and 4: the keeper's throughput, and trace recording on vs off.
#include "bench_actors.h"

namespace ampactor::bench::actors {

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
      auto keeper = spawn_scale_keeper(sys, opts, KeeperOptions().detached(false));
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

namespace {

namespace fs = std::filesystem;

/// One timed blast of n x (UnscaleDone + UpdateScale) at a fresh keeper, mode 0: trace off,
/// 1: on and flushed every iteration, 2: on and buffered. The us per iteration; with the trace on,
/// its size into `bytes`.
double time_keeper(caf::actor_system& sys, caf::scoped_actor& self, const GradScalerOptions& opts,
                   int n, int mode, const fs::path& file, std::uintmax_t& bytes) {
  const bool on = mode != 0;
  std::shared_ptr<TraceRecorder> sink;
  if (on) sink = record_trace(file.string(), TraceFileOptions().flush_iterations(mode == 1));
  auto keeper = spawn_scale_keeper(sys, opts, KeeperOptions().detached(true).tap(sink));
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
  return us;
}

/// (a) The keeper alone: each iteration records 3 events (2 inputs and UpdateApplied).
json trace_keeper(caf::actor_system& sys, const GradScalerOptions& opts, const fs::path& dir, int n,
                  int reps) {
  // on: crash-safe (a flush at every iteration's end, the default); buffered: flushed only when
  // the 1 MiB buffer fills or a second passes (TraceFileOptions().flush_iterations(false)).
  std::vector<double> off_us, on_us, buffered_us;
  std::uintmax_t bytes = 0;
  {
    caf::scoped_actor self{sys};
    for (int rep = 0; rep < reps; ++rep) {
      for (int mode : {0, 1, 2}) {
        const double us = time_keeper(sys, self, opts, n, mode, dir / "blast.jsonl", bytes);
        (mode == 0 ? off_us : mode == 1 ? on_us : buffered_us).push_back(us);
      }
      std::cout << "  rep " << rep + 1 << ": keeper " << fixed(off_us.back(), 3)
                << " us/iteration off, " << fixed(on_us.back(), 3) << " on, "
                << fixed(buffered_us.back(), 3) << " on buffered\n";
    }
  }
  const double keeper_off = median_of(off_us), keeper_on = median_of(on_us),
               keeper_buffered = median_of(buffered_us);
  std::cout << "  keeper median: " << fixed(keeper_off, 3) << " us/iteration off, "
            << fixed(keeper_on, 3) << " on (+" << fixed(keeper_on - keeper_off, 3) << " us, "
            << fixed(double(bytes) / n, 0) << " bytes/iteration), " << fixed(keeper_buffered, 3)
            << " on buffered (+" << fixed(keeper_buffered - keeper_off, 3) << " us)\n";
  return {{"iterations", n},
          {"events_per_iteration", 3},
          {"off_us_per_iteration", keeper_off},
          {"on_us_per_iteration", keeper_on},
          {"recording_us_per_iteration", keeper_on - keeper_off},
          {"buffered_us_per_iteration", keeper_buffered},
          {"buffered_recording_us_per_iteration", keeper_buffered - keeper_off},
          {"reps_buffered_us", buffered_us},
          {"bytes_per_iteration", double(bytes) / n},
          {"reps_off_us", off_us},
          {"reps_on_us", on_us}};
}

/// (b) The GradScaler loops of section 2, trace off and on, interleaved; their figures into out.
/// The step() loop's trace is left in `step_trace`.
void trace_loops(const GradScalerOptions& opts, const fs::path& dir, const std::string& step_trace,
                 int rounds, int iters, int settle_ms, json& out) {
  const std::vector<at::Tensor> init{at::randn({256}), at::randn({16, 16})};
  const std::vector<at::Tensor> grads{at::randn({256}) * 1000, at::randn({16, 16}) * 1000};
  const at::Tensor one = at::ones({1});
  const std::string submit_trace = (dir / "submit.jsonl").string();
  const std::string buffered_trace = (dir / "step-buffered.jsonl").string();
  struct Loop {
    std::string key;
    std::function<void(int)> run;
    std::vector<double> us;
  };
  Tiny m_step_off(init, grads), m_step_on(init, grads), m_sub_off(init, grads),
      m_sub_on(init, grads), m_step_buf(init, grads);
  GradScaler step_off(opts), step_on(opts, KeeperOptions().tap(record_trace(step_trace)));
  GradScaler step_buf(opts, KeeperOptions().tap(record_trace(
                                buffered_trace, TraceFileOptions().flush_iterations(false))));
  GradScaler sub_off(opts), sub_on(opts, KeeperOptions().tap(record_trace(submit_trace)));
  NoMarks none;
  std::vector<Loop> loops;
  loops.push_back({"step_off", [&](int k) { step_loop(step_off, m_step_off, one, k, none); }, {}});
  loops.push_back({"step_on", [&](int k) { step_loop(step_on, m_step_on, one, k, none); }, {}});
  loops.push_back(
      {"step_buffered", [&](int k) { step_loop(step_buf, m_step_buf, one, k, none); }, {}});
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
  const double buf = out["step_buffered_us_per_iteration"];
  const double off = out["step_off_us_per_iteration"];
  std::cout << "  GradScaler step, trace buffered: " << fixed(buf) << " us/iteration ("
            << (buf >= off ? "+" : "") << fixed(buf - off) << " us)\n";
  out["step_buffered_recording_us_per_iteration"] = buf - off;
}

/// The recorded run must replay bit for bit, or the figures measured a broken recorder.
json check_replay(const std::string& step_trace) {
  const auto t0 = Clock::now();
  const Trace t = read_trace(step_trace);
  const ReplayResult rr = replay_trace(t);
  if (!rr.identical)
    throw std::runtime_error("trace bench: the recorded run did not replay (line " +
                             std::to_string(rr.line) + ")");
  const double replay_ms = us_since(t0) / 1000;
  std::cout << "  the step() trace (" << t.events.size() << " events) read and replayed "
            << "identically in " << fixed(replay_ms, 0) << " ms\n";
  return {{"events", t.events.size()}, {"read_and_replay_ms", replay_ms}};
}

}  // namespace

json bench_trace(const GradScalerOptions& opts, int rounds, int iters, int settle_ms, int n,
                 int reps) {
  std::cout << "\n[4. trace recording (JSON Lines to a file), on vs off: the keeper's time for "
            << n << " x (UnscaleDone + UpdateScale), " << reps
            << " repetitions; and the GradScaler "
            << "loops, " << rounds << " rounds x " << iters << " iterations, interleaved]\n";
  const fs::path dir =
      fs::temp_directory_path() / ("ampactor-bench-trace-" + std::to_string(getpid()));
  fs::create_directories(dir);
  json out = json::object();

  BenchConfig cfg;
  caf::actor_system sys{cfg};  // (a)'s, which stays up while (b) runs
  out["keeper"] = trace_keeper(sys, opts, dir, n, reps);
  const std::string step_trace = (dir / "step.jsonl").string();
  trace_loops(opts, dir, step_trace, rounds, iters, settle_ms, out);
  out["replay"] = check_replay(step_trace);
  out["rounds"] = rounds;
  out["iterations_per_round"] = iters;
  bench::remove_tree(dir.string());
  return out;
}

}  // namespace ampactor::bench::actors
