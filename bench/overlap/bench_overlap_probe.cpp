// ampactor-bench-overlap: the costs alone and together, and how the machine's cores share it.
#include "bench_overlap.h"

namespace ampactor::bench::overlap {

/// Forward+backward and an Adam step, each timed alone on this thread.
std::pair<double, double> cost_ms(const Workload& w, int reps) {
  auto p = w.fresh_params();
  torch::optim::Adam opt(p, torch::optim::AdamOptions(1e-4));
  std::vector<double> f, o;
  for (int i = 0; i < reps + 2; ++i) {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
    auto t0 = Clock::now();
    w.loss(p).backward();
    const double fb = ms_since(t0);
    t0 = Clock::now();
    opt.step();
    const double st = ms_since(t0);
    if (i >= 2) f.push_back(fb), o.push_back(st);
  }
  return {median_of(f), median_of(o)};
}

/// How the machine's two cores share it: a kernel timed alone on this thread, then on two threads
/// at once (one on each core, separate buffers). Returns (alone, mean of the two together) in ms.
template <class F>
std::pair<double, double> alone_and_together(F kernel) {
  const double alone = kernel();
  double r[2];
  std::thread other([&] {
    at::get_num_threads();
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    r[1] = kernel();
  });
  r[0] = kernel();
  other.join();
  return {alone, 0.5 * (r[0] + r[1])};
}

/// Three kinds of work, each alone and on both cores at once: a matmul whose operands fit the
/// core's own cache, copies within the shared last-level cache, and copies from main memory.
json machine_probe() {
  auto matmul = [] {
    auto a = at::randn({128, 128}), b = at::randn({128, 128}), c = at::empty({128, 128});
    at::mm_out(c, a, b);
    const auto t0 = Clock::now();
    for (int i = 0; i < 2000; ++i)
      at::mm_out(c, a, b);
    return ms_since(t0);
  };
  auto copies = [](std::int64_t bytes, int reps) {
    return [=] {
      auto a = at::ones({bytes / 4}), b = at::empty({bytes / 4});
      b.copy_(a);
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i)
        b.copy_(a);
      return ms_since(t0);
    };
  };
  json res;
  std::cout << "machine: time alone -> on both cores at once (each)\n";
  for (auto& [key, label, kernel] :
       std::vector<std::tuple<std::string, std::string, std::function<double()>>>{
           {"matmul_in_core_cache", "matmul 128x128 (in the core's cache)", matmul},
           {"copy_4MiB_last_level_cache", "copy 4 MiB (last-level cache)", copies(4 << 20, 1000)},
           {"copy_128MiB_memory", "copy 128 MiB (main memory)", copies(128 << 20, 10)}}) {
    const auto [alone, together] = alone_and_together(kernel);
    res[key] = {{"alone_ms", alone}, {"together_ms", together}, {"slowdown", together / alone}};
    std::cout << "  " << std::left << std::setw(40) << label << std::right << std::fixed
              << std::setprecision(1) << std::setw(8) << alone << " ms -> " << std::setw(7)
              << together << " ms (" << std::setprecision(2) << together / alone << "x)\n";
  }
  return res;
}

/// Forward+backward on this thread and Adam steps on another thread (its own parameters), at the
/// same time: how much the two slow each other down when they share the machine (memory
/// bandwidth, the last-level cache). Returns the medians (forward+backward, Adam step).
std::pair<double, double> concurrent_cost_ms(const Workload& w, int reps) {
  auto p = w.fresh_params();
  std::atomic<bool> stop{false};
  std::vector<double> o;
  std::thread other([&] {
    at::get_num_threads();
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    auto q = w.fresh_params();
    for (auto& t : q)
      t.mutable_grad() = at::ones_like(t);
    torch::optim::Adam opt(q, torch::optim::AdamOptions(1e-4));
    while (!stop.load()) {
      const auto t0 = Clock::now();
      opt.step();
      o.push_back(ms_since(t0));
    }
  });
  std::vector<double> f;
  for (int i = 0; i < reps + 2; ++i) {
    for (auto& t : p)
      t.mutable_grad() = at::Tensor();
    const auto t0 = Clock::now();
    w.loss(p).backward();
    if (i >= 2) f.push_back(ms_since(t0));
  }
  stop = true;
  other.join();
  return {median_of(f), median_of(o)};
}

}  // namespace ampactor::bench::overlap
