// The fused steps' driver: one parallel run per step, each thread an equal share of all the
// spans' elements (so hundreds of small tensors cost one wake-up, not one each). The threads are
// a pool of this file's own, not an OpenMP team: OpenMP counts every team's threads, and once the
// trainer's team and an optimizer thread's team together outnumber the cores, every team stops
// spinning and each of the trainer's many small parallel regions sleeps and wakes through the
// kernel. The pool's threads sleep on a condition variable between steps. No torch.
#include <ampactor/kernels/fused_step.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "cpu_features.h"
#include "optim_loops.h"

namespace ampactor::kernels {
namespace {

const cpu::OptimLoopTable& table() {
  static const cpu::OptimLoopTable& chosen = []() -> const cpu::OptimLoopTable& {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    const bool aten_default = cap && std::strcmp(cap, "default") == 0;
    if (!aten_default && cpu::has_avx2_f16c_fma()) return cpu::avx2_optim_loops();
    return cpu::baseline_optim_loops();
  }();
  return chosen;
}

/// Worker threads that run one function as shares 1..n-1 while the caller runs share 0. One
/// run at a time (a second caller waits); workers are made on first need and live until exit.
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
  void run(int n, const std::function<void(int, int)>& fn) {
    std::lock_guard<std::mutex> one_run(run_m_);
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

Pool& pool() {
  static Pool p;
  return p;
}

// Elements per share boundary: 16 floats, one cache line of each fp32 array, so that two
// threads never write the same line.
constexpr std::int64_t kAlign = 16;

template <typename Consts, typename Loop>
void run(const std::vector<StepSpan>& spans, const std::vector<Consts>& consts, int threads,
         Loop loop) {
  std::int64_t total = 0;
  for (const StepSpan& s : spans)
    total += s.n;
  if (total == 0) return;
  // Below ~64 Ki elements a team's wake-up costs more than it saves.
  if (threads > 1 && total < (std::int64_t(1) << 16)) threads = 1;
  auto share = [&](int t, int nt) {
    std::int64_t lo = total * t / nt, hi = total * (t + 1) / nt;
    lo = t == 0 ? 0 : lo / kAlign * kAlign;
    hi = t == nt - 1 ? total : hi / kAlign * kAlign;
    std::int64_t base = 0;  // the first element of the span in the flattened order
    for (const StepSpan& s : spans) {
      const std::int64_t b = lo > base ? lo - base : 0, e = hi < base + s.n ? hi - base : s.n;
      if (b < e) loop(s, consts[std::size_t(s.consts)], b, e);
      base += s.n;
      if (base >= hi) break;
    }
  };
  if (threads <= 1) return share(0, 1);
  pool().run(threads, share);
}

}  // namespace

void adam_step(const std::vector<StepSpan>& spans, const std::vector<AdamConsts>& consts,
               int threads) {
  run(spans, consts, threads, table().adam);
}

void sgd_step(const std::vector<StepSpan>& spans, const std::vector<SgdConsts>& consts,
              int threads) {
  run(spans, consts, threads, table().sgd);
}

const char* fused_step_variant() {
  return table().name;
}

}  // namespace ampactor::kernels
