// The kernels' worker pool (kernels/cpu/pool.h): every share runs once, and a second thread's run
// while the pool is busy runs on its caller instead of waiting behind the first.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <omp.h>

#include "pool.h"

using ampactor::kernels::cpu::parallel_run;

TEST_CASE("parallel_run runs every share exactly once, the caller's being share 0") {
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    std::mutex mu;
    std::vector<int> ran(std::size_t(n), 0);
    const auto caller = std::this_thread::get_id();
    const int shares = parallel_run(n, [&](int t, int nt) {
      std::lock_guard<std::mutex> lock(mu);
      CHECK(nt == n);
      ++ran[std::size_t(t)];
      if (t == 0) CHECK((std::this_thread::get_id() == caller));
    });
    CHECK(shares == n);
    for (int r : ran)
      CHECK(r == 1);
  }
}

TEST_CASE("a run while another thread's run holds the pool runs alone on its caller") {
  std::promise<void> inside, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first_in{false};
  auto first = std::async(std::launch::async, [&] {
    return parallel_run(2, [&](int t, int) {
      if (t != 0) return;
      first_in = true;
      inside.set_value();
      // Bounded: the test releases it at once; the timeout only keeps a broken pool from hanging.
      released.wait_for(std::chrono::seconds(30));
    });
  });
  REQUIRE(inside.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  std::vector<std::pair<int, int>> seen;
  const auto caller = std::this_thread::get_id();
  bool all_on_caller = true;
  const int shares = parallel_run(2, [&](int t, int nt) {
    seen.emplace_back(t, nt);
    all_on_caller &= std::this_thread::get_id() == caller;
  });
  release.set_value();
  CHECK(shares == 1);
  CHECK(seen == std::vector<std::pair<int, int>>{{0, 1}});
  CHECK(all_on_caller);
  REQUIRE(first.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(first.get() == 2);
  CHECK(first_in);
}

TEST_CASE(
    "run_shares runs on the main thread's OpenMP team, and elsewhere on pool threads outside any "
    "OpenMP region") {
  using ampactor::kernels::cpu::run_shares;
  using ampactor::kernels::cpu::shares_on_omp_team;
  // doctest runs the cases on the process's main thread.
  auto check_run = [](bool on_team) {
    std::mutex mu;
    std::vector<int> ran(2, 0);
    std::vector<bool> in_region(2, false);
    std::vector<std::thread::id> ran_on(2);
    const std::thread::id caller = std::this_thread::get_id();
    const int shares = run_shares(2, [&](int t, int nt) {
      std::lock_guard<std::mutex> lock(mu);
      CHECK(nt == 2);
      ++ran[std::size_t(t)];
      in_region[std::size_t(t)] = omp_in_parallel() != 0;
      ran_on[std::size_t(t)] = std::this_thread::get_id();
    });
    CHECK(shares == 2);
    for (int t = 0; t < 2; ++t) {
      CHECK(ran[std::size_t(t)] == 1);
      CHECK(in_region[std::size_t(t)] == on_team);
    }
    // Share 0 on the caller, share 1 on a worker: the team's, or the pool's (no OpenMP region).
    CHECK((ran_on[0] == caller));
    CHECK((ran_on[1] != caller));
  };
#if defined(__SANITIZE_THREAD__)
  CHECK_FALSE(shares_on_omp_team());  // ThreadSanitizer cannot see libgomp's barriers
#else
  CHECK(shares_on_omp_team());
#endif
  check_run(shares_on_omp_team());
  bool other_on_team = true;
  std::thread other([&] {
    other_on_team = shares_on_omp_team();
    check_run(false);
  });
  other.join();
  CHECK_FALSE(other_on_team);
}
