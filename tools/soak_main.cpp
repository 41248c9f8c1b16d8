// ampactor-soak: GradScaler's asynchronous step jobs against the thread-free rule, with faults.
// Each iteration draws what goes wrong (inf or NaN gradients, a job that throws before or after
// its step, a cancel, an update(new_scale)), runs it through GradScaler, and checks the scale the
// next iteration is given, the skip and the abandoned updates against ScaleState driven by the
// same draws. A watchdog ends a hang; the resident memory is sampled as it goes.
// Exit: 0 all equal; 1 a mismatch; 2 bad arguments; 3 a hang; 4 memory kept growing.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/scale_state.h>

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <thread>

using namespace ampactor;
using Clock = std::chrono::steady_clock;

namespace {

double rss_mib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return double(resident) * double(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

struct Draw {
  bool inf = false, nan = false, throw_before = false, throw_after = false, cancel = false;
  std::optional<double> new_scale;
};

Draw draw(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  Draw d;
  d.inf = u(rng) < 0.03;
  d.nan = u(rng) < 0.01;
  d.throw_before = u(rng) < 0.01;
  d.throw_after = u(rng) < 0.005;
  d.cancel = u(rng) < 0.01;
  if (u(rng) < 0.005) d.new_scale = std::ldexp(1.0, int(rng() % 25));  // 1 .. 2^24
  return d;
}

/// The command line.
struct Settings {
  long iterations = 100000, report = 10000;
  std::uint64_t seed = 1;
  int watchdog_s = 60;
  double leak_mib = 64;
};

void add_options(CLI::App& app, Settings& o) {
  app.add_option("--iterations", o.iterations, "iterations")->check(CLI::Range(1L, 1000000000L));
  app.add_option("--seed", o.seed, "seed of the fault draws");
  app.add_option("--report-every", o.report, "iterations between progress lines")
      ->check(CLI::Range(1L, 1000000000L));
  app.add_option("--watchdog", o.watchdog_s, "seconds without progress that count as a hang")
      ->check(CLI::Range(1, 3600));
  app.add_option("--leak-mib", o.leak_mib,
                 "growth of resident memory from the first quarter to the end that counts as a "
                 "leak")
      ->check(CLI::PositiveNumber);
}

/// The watchdog's loop: until `done`, ends the process (exit 3) once `progress` has stood still
/// for `seconds`.
void watch(const std::atomic<long>& progress, const std::atomic<bool>& done, int seconds) {
  long last = -1;
  auto since = Clock::now();
  while (!done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const long now = progress.load();
    if (now != last) {
      last = now, since = Clock::now();
    } else if (Clock::now() - since > std::chrono::seconds(seconds)) {
      std::fprintf(stderr, "ampactor-soak: HANG: no progress for %d s at iteration %ld\n", seconds,
                   now);
      std::_Exit(3);
    }
  }
}

/// GradScaler and the thread-free rule (ScaleState), driven by the same draws.
struct Soak {
  explicit Soak(std::uint64_t seed)
      : opts(GradScalerOptions().init_scale(65536).growth_interval(20)),
        scaler(opts),
        ref(opts),
        w(at::zeros({64}).set_requires_grad(true)),
        opt({w}, torch::optim::SGDOptions(1e-6)),
        rng(seed) {
    ref.lazy_init();
  }

  void mismatch(long k, const std::string& what) {
    if (mismatches++ < 10)
      std::cerr << "ampactor-soak: MISMATCH at iteration " << k << ": " << what << "\n";
  }

  /// Iteration `k`: one draw through GradScaler, checked against the rule, which then follows.
  void iteration(long k) {
    const Draw d = draw(rng);
    scaler.scale(at::ones({1}));
    const double s = scaler.get_scale();
    if (s != double(ref.scale()))
      mismatch(k, "scale " + std::to_string(s) + ", the rule's " + std::to_string(ref.scale()));
    const float g = d.nan ? NAN : d.inf ? INFINITY : 1.0f;
    scaler.submit([&, d, g, s] {
      if (d.throw_before) throw std::runtime_error("injected before the step");
      w.mutable_grad() = at::full({64}, g * float(s));
      scaler.step(opt);
      if (d.throw_after) throw std::runtime_error("injected after the step");
    });
    if (d.cancel) scaler.cancel();  // drops the job if it has not started yet
    try {
      if (d.new_scale)
        scaler.update(*d.new_scale);
      else
        scaler.update();
      scaler.sync();
    } catch (const ScalerError& e) {
      if (e.code() != errc::step_failed && e.code() != errc::no_inf_checks_before_update)
        mismatch(k, std::string("unexpected error: ") + e.what());
    }
    const IterationResult r = scaler.wait_result(k);
    const bool abandoned = r.failed || r.cancelled_jobs > 0;
    const bool ran_step = !r.steps.empty();
    if (ran_step && r.steps[0].found_inf != (d.inf || d.nan)) mismatch(k, "found_inf");
    if (r.failed != ((d.throw_before || d.throw_after) && r.cancelled_jobs == 0))
      mismatch(k, "failed " + std::to_string(r.failed));
    if (!abandoned) {
      if (d.new_scale)
        ref.set_scale(*d.new_scale), ++overrides;
      else
        ref.update(d.inf || d.nan);
    }
    skipped += ran_step && r.steps[0].skipped;
    failed += r.failed;
    cancelled += r.cancelled_jobs > 0;
  }

  /// The progress line after `done` iterations.
  void report(long done, Clock::time_point t0) const {
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << "iteration " << done << "  rss " << std::fixed << std::setprecision(1) << rss_mib()
              << " MiB  " << std::setprecision(0) << done / secs << " it/s  skipped " << skipped
              << "  failed " << failed << "  cancelled " << cancelled << "  overrides " << overrides
              << "  mismatches " << mismatches << std::endl;
  }

  const GradScalerOptions opts;
  GradScaler scaler;
  ScaleState ref;
  at::Tensor w;
  torch::optim::SGD opt;
  std::mt19937_64 rng;
  long mismatches = 0, skipped = 0, failed = 0, cancelled = 0, overrides = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "GradScaler's step jobs against the thread-free rule, with injected faults; "
      "exit 0 all equal, 1 a mismatch, 3 a hang, 4 memory kept growing."};
  Settings o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);

  std::atomic<long> progress{0};
  std::atomic<bool> done{false};
  std::thread watchdog([&] { watch(progress, done, o.watchdog_s); });

  Soak soak(o.seed);
  double rss_quarter = 0;
  const double rss_start = rss_mib();
  const auto t0 = Clock::now();
  for (long k = 0; k < o.iterations; ++k) {
    soak.iteration(k);
    progress = k + 1;
    if (k + 1 == o.iterations / 4) rss_quarter = rss_mib();
    if ((k + 1) % o.report == 0 || k + 1 == o.iterations) soak.report(k + 1, t0);
  }
  done = true;
  watchdog.join();
  const double rss_end = rss_mib();
  std::cout << "rss start " << std::setprecision(1) << rss_start << " MiB, at a quarter "
            << rss_quarter << ", end " << rss_end << "; "
            << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";
  if (soak.mismatches) return 1;
  if (o.iterations >= 4 && rss_end - rss_quarter > o.leak_mib) {
    std::cerr << "ampactor-soak: memory grew " << rss_end - rss_quarter
              << " MiB after the first quarter\n";
    return 4;
  }
  return 0;
}
