// ampactor-bench-actors, section 2: the per-iteration overhead of the actor-backed GradScaler.
#include "bench_actors.h"

namespace ampactor::bench::actors {

namespace {

/// The variants' loops: a warm-up, then `rounds` rounds of each variant timed and instrumented,
/// in an order rotating from round to round; the figures into each Variant.
void run_rounds(std::vector<Variant>& vs, int rounds, int iters, int settle_ms) {
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
}

/// The medians of each variant, printed against the first (LocalGradScaler) and returned.
json summarize(std::vector<Variant>& vs) {
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
  return out;
}

}  // namespace

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
  GradScaler actor_lagged(opts, KeeperOptions().policy(ScalePolicy::lagged));

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

  run_rounds(vs, rounds, iters, settle_ms);
  json out = summarize(vs);
  const double base = vs[0].median_us;
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

}  // namespace ampactor::bench::actors
