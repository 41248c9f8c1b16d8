// ampactor-bench-actors: what the actors cost, measured side by side in one run: the round trip
// of a ScaleRequest from the main thread to the scale_keeper (beside a bare CAF echo actor), the
// per-iteration overhead of the actor-backed GradScaler beside the thread-free LocalGradScaler on
// the same tiny workload, and the keeper's message throughput. Not a test: it reports figures and
// goals and never fails on them; it fails only when a measurement could not be trusted (an error
// reply, or a keeper that did not apply every update it was sent).
#include "bench_actors.h"
#include "bench_setup.h"

using namespace ampactor::bench::actors;

namespace {

/// The command line.
struct Settings {
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

  /// --quick: few requests, rounds and messages.
  void make_quick() {
    requests = 2000;
    spaced = 30;
    warmup_s = 0.2;
    rounds = 3;
    iters = 100;
    messages = 20000;
    reps = 1;
  }
};

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--requests", s.requests, "timed back-to-back ScaleRequest round trips")
      ->check(CLI::Range(10, 10000000));
  app.add_option("--spaced", s.spaced, "timed round trips with a pause before each")
      ->check(CLI::Range(10, 100000));
  app.add_option("--gap-us", s.gap_us, "the pause before each spaced round trip, microseconds")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--blocks", s.blocks, "interleaved blocks of the back-to-back round trips")
      ->check(CLI::Range(1, 1000));
  app.add_option("--warmup-seconds", s.warmup_s, "untimed round trips before the timed ones")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", s.rounds, "interleaved rounds of the scaler loops")
      ->check(CLI::Range(1, 1000));
  app.add_option("--settle-ms", s.settle_ms, "pause before each timed loop, milliseconds")
      ->check(CLI::Range(0, 10000));
  app.add_option("--iterations", s.iters, "iterations per round and scaler loop")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--messages", s.messages, "iterations (2 messages each) of the throughput blast")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--reps", s.reps, "repetitions of the throughput blast")
      ->check(CLI::Range(1, 100));
  app.add_option("--json", s.json_path, "write the figures as JSON to this file");
  app.add_flag("--quick", s.quick, "few requests, rounds and messages (a smoke run)");
}

/// The machine and the versions: printed, and returned for res["machine"].
json machine() {
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
  return {{"hardware_concurrency", hw},
          {"cpu", cpu_model()},
          {"caf_version", caf_version},
          {"libtorch_version", TORCH_VERSION},
          {"torch_intra_op_threads", at::get_num_threads()},
          {"scheduler_max_threads", 2},
          {"sleep_for_50us_median_us", sleep50}};
}

/// The summary table of the figures in res (non-const: a figure missing reads as null and throws).
void print_summary(json& res, const Latency& keeper, double overhead) {
  const auto& o = res["overhead"];
  const double rate = res["throughput"]["messages_per_second"];
  std::cout << "\nSummary\n";
  auto line = [](const std::string& what, const std::string& value, const std::string& note) {
    std::cout << "  " << std::left << std::setw(48) << what << std::setw(26) << value << note
              << std::right << "\n";
  };
  auto verdict = [](bool met) { return met ? std::string("met") : std::string("NOT met"); };
  auto lat = [&](const char* key) {
    const auto& l = res["latency"][key];
    return fixed(l["median_us"].get<double>()) + " / " + fixed(l["p99_us"].get<double>()) + " / " +
           fixed(l["mean_us"].get<double>()) + " us";
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
}

/// Runs every section into res, and prints the summary.
void run_all(const Settings& s, json& res) {
  const GradScalerOptions opts;  // torch's defaults
  Latency keeper;
  double overhead = 0;
  res["latency"] =
      bench_latency(opts, s.requests, s.blocks, s.warmup_s, s.spaced, s.gap_us, keeper);
  res["overhead"] = bench_overhead(opts, s.rounds, s.iters, s.settle_ms, overhead);
  res["throughput"] = bench_throughput(opts, s.messages, s.reps);
  res["trace"] =
      bench_trace(opts, s.rounds, s.iters, s.settle_ms, std::min(s.messages, 50000), s.reps);
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
  print_summary(res, keeper, overhead);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ampactor-bench-actors: keeper round trips, actor scaler overhead, keeper throughput"};
  Settings s;
  add_options(app, s);
  CLI11_PARSE(app, argc, argv);
  if (s.quick) s.make_quick();
  std::ofstream json_file;
  if (!s.json_path.empty()) {
    json_file.open(s.json_path);
    if (!json_file) {
      std::cerr << "--json: cannot write " << s.json_path << "\n";
      return 2;
    }
  }

  json res = json::object();
  res["machine"] = machine();
  res["quick"] = s.quick;
  try {
    run_all(s, res);
  } catch (const std::exception& e) {
    std::cerr << "ampactor-bench-actors: " << e.what() << "\n";
    return 1;
  }
  if (!s.json_path.empty()) {
    res["setup"] = ampactor::bench::run_setup();
    json_file << std::setw(2) << res << "\n";
    std::cout << "\nwrote " << s.json_path << "\n";
  }
  return 0;
}
