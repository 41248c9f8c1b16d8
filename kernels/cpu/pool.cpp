#include "pool.h"

#include <omp.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace ampactor::kernels::cpu {
namespace {

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_)
      t.join();
  }

  int run(int n, const std::function<void(int, int)>& fn) {
    std::unique_lock<std::mutex> one_run(run_m_, std::try_to_lock);
    if (!one_run.owns_lock()) {
      // Busy with another thread's pass: waiting would serialise two threads' work behind
      // each other (e.g. the trainer's unscale behind the optimizer thread's step).
      fn(0, 1);
      return 1;
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      while (int(threads_.size()) < n - 1) {
        const int index = int(threads_.size()) + 1;
        threads_.emplace_back([this, index] { work(index); });
      }
      job_ = &fn;
      n_ = n;
      pending_ = n - 1;
      ++generation_;
    }
    wake_.notify_all();
    fn(0, n);
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    return n;
  }

 private:
  void work(int index) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= n_) continue;  // a run with fewer threads than the pool has
      const std::function<void(int, int)>* fn = job_;
      const int n = n_;
      lock.unlock();
      (*fn)(index, n);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_m_, m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  int n_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

int parallel_run(int n, const std::function<void(int, int)>& fn) {
  if (n <= 1) {
    fn(0, 1);
    return 1;
  }
  static Pool pool;
  return pool.run(n, fn);
}

bool shares_on_omp_team() {
#if defined(__SANITIZE_THREAD__)
  return false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return false;
#endif
#endif
  static thread_local const bool main_thread = gettid() == getpid();
  return main_thread;
}

int run_shares(int n, const std::function<void(int, int)>& fn) {
  if (n <= 1 || !shares_on_omp_team()) return parallel_run(n, fn);
  int shares = 1;
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (t == 0) shares = nt;
    fn(t, nt);
  }
  return shares;
}

}  // namespace ampactor::kernels::cpu
