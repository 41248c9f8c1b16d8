// The fused steps' driver: one OpenMP region per step, each thread an equal share of all the
// spans' elements (so hundreds of small tensors cost one wake-up, not one each). No torch.
#include <ampactor/kernels/fused_step.h>

#include <omp.h>

#include <cstdlib>
#include <cstring>

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
#pragma omp parallel num_threads(threads)
  share(omp_get_thread_num(), omp_get_num_threads());
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
