// The CPU body of the unscale/check/move entries (kernels/unscale.cpp): chunks of rows run by
// the instruction set's loops, in parallel where the work is large enough.
#include "unscale_cpu.h"

#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "cpu_features.h"
#include "pool.h"

namespace ampactor::kernels::cpu {

const LoopTable& loops() {
  static const LoopTable& chosen = []() -> const LoopTable& {
    switch (pick_isa()) {
      case Isa::avx512:
        return avx512_loops();
      case Isa::avx2:
        return avx2_loops();
      default:
        return baseline_loops();
    }
  }();
  return chosen;
}

namespace {

// Chunk of work handed to one thread at a time: large enough to amortise dispatch, small enough
// to balance a list of mixed sizes.
constexpr std::int64_t kChunkElems = 1 << 16;
// Below this many elements in total, threads cost more than they save.
constexpr std::int64_t kParallelMinElems = 1 << 19;

struct Task {
  std::uint32_t job;
  std::int64_t row_begin, row_end, col_begin, col_end;
};

std::size_t elem_size(ElemType t) {
  return t == ElemType::f64 ? 8 : t == ElemType::f32 ? 4 : 2;
}

std::vector<Task> make_tasks(const std::vector<TensorWork>& jobs, std::int64_t* total) {
  std::vector<Task> tasks;
  *total = 0;
  for (std::uint32_t j = 0; j < jobs.size(); ++j) {
    const Layout& l = jobs[j].layout;
    *total += l.rows * l.cols;
    if (l.rows == 0 || l.cols == 0) continue;
    if (l.rows == 1) {
      for (std::int64_t c = 0; c < l.cols; c += kChunkElems)
        tasks.push_back({j, 0, 1, c, std::min(l.cols, c + kChunkElems)});
    } else {
      std::int64_t per = std::max<std::int64_t>(1, kChunkElems / l.cols);
      for (std::int64_t r = 0; r < l.rows; r += per)
        tasks.push_back({j, r, std::min(l.rows, r + per), 0, l.cols});
    }
  }
  return tasks;
}

/// `absmax`: null for the plain loops, else the task's running max for the *_max loops.
bool run_task(Op op, const TensorWork& job, const Task& task, float inv, const LoopTable& lt,
              float* absmax) {
  const Layout& l = job.layout;
  const std::size_t ea = elem_size(job.a.type);
  bool bad = false;
  for (std::int64_t r = task.row_begin; r < task.row_end; ++r) {
    char* pa = job.a.base + (l.row_offset(0, r) + task.col_begin * l.col_stride[0]) * ea;
    const std::int64_t n = task.col_end - task.col_begin;
    switch (op) {
      case Op::unscale:
        bad |=
            (absmax ? lt.unscale_max : lt.unscale)(job.a.type, pa, n, l.col_stride[0], inv, absmax);
        break;
      case Op::check:
        bad |= (absmax ? lt.check_max : lt.check)(job.a.type, pa, n, l.col_stride[0], absmax);
        break;
      case Op::move: {
        float* pb = reinterpret_cast<float*>(job.b.base) + l.row_offset(1, r) +
                    task.col_begin * l.col_stride[1];
        bad |= (absmax ? lt.move_max : lt.move)(job.a.type, pa, l.col_stride[0], pb,
                                                l.col_stride[1], n, inv, absmax);
        break;
      }
    }
  }
  return bad;
}

/// kHeldInf / kHeldNaN for one element of type t: all exponent bits set, and a mantissa.
std::uint8_t held(ElemType t, const char* p) {
  std::uint64_t b = 0, exp = 0, mant = 0;
  switch (t) {
    case ElemType::f32: {
      std::uint32_t u;
      std::memcpy(&u, p, 4);
      b = u, exp = 0x7f800000u, mant = 0x007fffffu;
      break;
    }
    case ElemType::f64:
      std::memcpy(&b, p, 8);
      exp = 0x7ff0000000000000ull, mant = 0x000fffffffffffffull;
      break;
    case ElemType::f16:
    case ElemType::bf16: {
      std::uint16_t u;
      std::memcpy(&u, p, 2);
      b = u;
      exp = t == ElemType::f16 ? 0x7c00u : 0x7f80u;
      mant = t == ElemType::f16 ? 0x03ffu : 0x007fu;
      break;
    }
  }
  if ((b & exp) != exp) return 0;
  return (b & mant) ? kHeldNaN : kHeldInf;
}

/// What a task's chunk of operand a holds (read again: only chunks that found a non-finite).
std::uint8_t classify(const TensorWork& job, const Task& task) {
  const Layout& l = job.layout;
  const std::size_t ea = elem_size(job.a.type);
  std::uint8_t out = 0;
  for (std::int64_t r = task.row_begin; r < task.row_end; ++r) {
    const char* pa = job.a.base + (l.row_offset(0, r) + task.col_begin * l.col_stride[0]) * ea;
    for (std::int64_t c = 0; c < task.col_end - task.col_begin; ++c)
      out |= held(job.a.type, pa + c * l.col_stride[0] * std::int64_t(ea));
    if (out == (kHeldInf | kHeldNaN)) break;
  }
  return out;
}

/// Runs every job; returns whether any element was inf or NaN. With `absmax`, raises it to the
/// largest finite |element| read (threads keep their own max and merge once at the end). With
/// `flags`, the attribution of each job (run_cpu).
bool run(Op op, const std::vector<TensorWork>& jobs, float inv, float* absmax,
         std::uint8_t* flags) {
  std::int64_t total = 0;
  const std::vector<Task> tasks = make_tasks(jobs, &total);
  const LoopTable& lt = loops();
  if (total < kParallelMinElems || at::get_num_threads() == 1 || at::in_parallel_region()) {
    bool bad = false;
    for (const Task& t : tasks)
      if (run_task(op, jobs[t.job], t, inv, lt, absmax)) {
        bad = true;
        if (flags) flags[t.job] |= classify(jobs[t.job], t);
      }
    return bad;
  }
  // As the fused step that may follow: on the main thread's OpenMP team, else on the kernels'
  // own pool (pool.h's run_shares says why).
  std::atomic<bool> found{false};
  std::mutex mu;
  const std::int64_t count = std::int64_t(tasks.size());
  run_shares(at::get_num_threads(), [&](int t, int nt) {
    bool bad = false;
    float mx = 0;
    for (std::int64_t i = count * t / nt; i < count * (t + 1) / nt; ++i) {
      const Task& task = tasks[std::size_t(i)];
      if (!run_task(op, jobs[task.job], task, inv, lt, absmax ? &mx : nullptr)) continue;
      bad = true;
      if (!flags) continue;
      const std::uint8_t h = classify(jobs[task.job], task);
      const std::lock_guard<std::mutex> lock(mu);  // tasks of one job may run on two threads
      flags[task.job] |= h;
    }
    if (bad) found.store(true, std::memory_order_relaxed);
    if (absmax && mx > 0) {
      const std::lock_guard<std::mutex> lock(mu);
      if (mx > *absmax) *absmax = mx;
    }
  });
  return found.load();
}

}  // namespace

/// Runs the loops, raising the host tensor `absmax` (when given) through a local float.
bool run_cpu(Op op, const std::vector<TensorWork>& jobs, float inv, at::Tensor* absmax,
             std::uint8_t* flags) {
  if (!absmax) return run(op, jobs, inv, nullptr, flags);
  float mx = absmax->data_ptr<float>()[0];
  const bool bad = run(op, jobs, inv, &mx, flags);
  absmax->data_ptr<float>()[0] = mx;
  return bad;
}

}  // namespace ampactor::kernels::cpu
