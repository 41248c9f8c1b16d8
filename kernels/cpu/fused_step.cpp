// The fused steps' driver: one parallel run per step, each thread an equal share of all the
// spans' elements (so hundreds of small tensors cost one wake-up, not one each), on the main
// thread's OpenMP team or the kernels' own worker pool (pool.h's run_shares says which). No torch.
#include <ampactor/kernels/fused_step.h>

#include "cpu_features.h"
#include "optim_loops.h"
#include "pool.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace ampactor::kernels {
namespace {

const cpu::OptimLoopTable& table() {
  // ATEN_CPU_CAPABILITY=default caps both LibTorch and these loops at no FMA (see pick_isa).
  static const cpu::OptimLoopTable& chosen = []() -> const cpu::OptimLoopTable& {
    switch (cpu::pick_isa()) {
      case cpu::Isa::avx512:
        return cpu::avx512_optim_loops();
      case cpu::Isa::avx2:
        return cpu::avx2_optim_loops();
      default:
        return cpu::baseline_optim_loops();
    }
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
  cpu::run_shares(threads, share);
}

// The last-level cache's size (0 where the system does not say).
std::int64_t llc_bytes() {
  static const std::int64_t bytes = [] {
    for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
      if (const long b = sysconf(name); b > 0) return std::int64_t(b);
    return std::int64_t(0);
  }();
  return bytes;
}

// Whether steps beyond the cache stream the weights (stream_weight): yes, unless
// AMPACTOR_STREAM_WEIGHTS=0 or set_stream_weights(false), which benchmarks use to measure what
// streaming gains.
std::atomic<bool>& streaming() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("AMPACTOR_STREAM_WEIGHTS");
    return e == nullptr || std::string_view(e) != "0";
  }()};
  return on;
}

std::int64_t elem_bytes(StepElem t) {
  return t == StepElem::f32 ? 4 : 2;
}

// Whether the spans' arrays together (each counted once) fit the last-level cache.
enum class Fit : std::uint8_t { unknown, fits, beyond };
Fit cache_fit(const std::vector<StepSpan>& spans) {
  if (llc_bytes() == 0) return Fit::unknown;
  std::int64_t bytes = 0;
  for (const StepSpan& s : spans)
    bytes += s.n * (4 + (s.m ? 4 : 0) + (s.v ? 4 : 0) + (s.vmax ? 4 : 0) + elem_bytes(s.grad_type) +
                    (s.weight ? elem_bytes(s.weight_type) : 0) + (s.param_out ? 4 : 0) +
                    (s.m_out ? 4 : 0) + (s.v_out ? 4 : 0) + (s.vmax_out ? 4 : 0));
  return bytes <= llc_bytes() ? Fit::fits : Fit::beyond;
}

}  // namespace

void adam_step(const std::vector<StepSpan>& spans, const std::vector<AdamConsts>& consts,
               int threads) {
  const Fit fit = cache_fit(spans);
  std::vector<AdamConsts> cs = consts;
  for (AdamConsts& c : cs) {
    c.reciprocal = fit == Fit::fits;
    c.stream_weight = fit == Fit::beyond && stream_weights();
  }
  run(spans, cs, threads, table().adam);
}

void sgd_step(const std::vector<StepSpan>& spans, const std::vector<SgdConsts>& consts,
              int threads) {
  const bool stream = cache_fit(spans) == Fit::beyond && stream_weights();
  std::vector<SgdConsts> cs = consts;
  for (SgdConsts& c : cs)
    c.stream_weight = stream;
  run(spans, cs, threads, table().sgd);
}

void set_stream_weights(bool on) {
  streaming().store(on, std::memory_order_relaxed);
}

bool stream_weights() {
  return streaming().load(std::memory_order_relaxed);
}

const char* fused_step_variant() {
  return table().name;
}

}  // namespace ampactor::kernels
