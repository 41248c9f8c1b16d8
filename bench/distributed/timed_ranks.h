// A RankGroup that times the collectives it passes on: the data-parallel benches' probe.
#pragma once

#include <ampactor/scaler/ranks.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"

namespace ampactor::bench {

class TimedRanks final : public ForwardingRanks {
 public:
  using ForwardingRanks::ForwardingRanks;
  void average(std::vector<at::Tensor>& t, float* v, int n) override {
    const auto t0 = Clock::now();
    ForwardingRanks::average(t, v, n);
    average_ms.push_back(ms_since(t0));
  }
  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds, float* v,
                      int n) override {
    const auto t0 = Clock::now();
    ForwardingRanks::reduce_scatter(part, bounds, v, n);
    average_ms.push_back(ms_since(t0));
  }
  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    const auto t0 = Clock::now();
    ForwardingRanks::all_gather(mine, gathered);
    gather_ms.push_back(ms_since(t0));
  }
  /// Each call's milliseconds, in order (average_ms: the gradients' average or reduce-scatter).
  std::vector<double> average_ms, gather_ms;
};

/// The sum of v's entries from `from` on.
inline double sum_from(const std::vector<double>& v, std::size_t from) {
  double s = 0;
  for (std::size_t i = from; i < v.size(); ++i)
    s += v[i];
  return s;
}

}  // namespace ampactor::bench
