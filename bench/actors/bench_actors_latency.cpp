// ampactor-bench-actors, section 1: ScaleRequest round trips beside a bare CAF echo actor.
#include "bench_actors.h"

namespace ampactor::bench::actors {

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
    auto keeper = spawn_scale_keeper(sys, opts, KeeperOptions().detached(false));
    // The keeper as GradScaler spawns it: a thread of its own.
    auto keeper_detached = spawn_scale_keeper(sys, opts, KeeperOptions().detached(true));
    auto echo = sys.spawn(echo_actor);
    auto echo_detached = sys.spawn<caf::detached>(echo_actor);
    // The same keeper in an actor system whose workers wait on a condition variable (CAF's
    // work-sharing policy) instead of polling and sleeping (work stealing, the default).
    caf::scoped_actor self_sharing{sys_sharing};
    auto keeper_sharing = spawn_scale_keeper(sys_sharing, opts, KeeperOptions().detached(false));
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

    // Always iteration 0: under the exact policy the keeper answers it at once (no update comes
    // before it), so each request times one round trip; a later iteration would need its
    // predecessor's update first (and is refused as a protocol misuse without one).
    const iteration_t k = 0;
    const auto w0 = Clock::now();
    while (us_since(w0) < warmup_s * 1e6)
      for (Target& t : ts)
        for (int i = 0; i < 100; ++i)
          t.ask(self, k);

    const int per_block = std::max(1, n / blocks);
    for (int b = 0; b < blocks; ++b)
      for (std::size_t j = 0; j < ts.size(); ++j) {
        Target& t = ts[(j + std::size_t(b)) % ts.size()];
        for (int i = 0; i < per_block; ++i) {
          const auto t0 = Clock::now();
          t.ask(self, k);
          t.us.push_back(us_since(t0));
        }
      }
    for (int i = 0; i < n_spaced; ++i)
      for (Target& t : ts) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
        const auto t0 = Clock::now();
        t.ask(self, k);
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

}  // namespace ampactor::bench::actors
