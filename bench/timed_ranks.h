// A RankGroup that times the collectives it passes on: the data-parallel benches' probe.
#pragma once

#include <ampactor/scaler/ranks.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"

namespace ampactor::bench {

class TimedRanks final : public RankGroup {
 public:
  explicit TimedRanks(std::shared_ptr<RankGroup> inner) : in_(std::move(inner)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  void all_max(float* v, int n) override { in_->all_max(v, n); }
  void average(std::vector<at::Tensor>& t, float* v, int n) override {
    const auto t0 = Clock::now();
    in_->average(t, v, n);
    average_ms.push_back(ms_since(t0));
  }
  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds, float* v,
                      int n) override {
    const auto t0 = Clock::now();
    in_->reduce_scatter(part, bounds, v, n);
    average_ms.push_back(ms_since(t0));
  }
  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    const auto t0 = Clock::now();
    in_->all_gather(mine, gathered);
    gather_ms.push_back(ms_since(t0));
  }
  void fail(const std::string& why) noexcept override { in_->fail(why); }
  void require_same(const std::string& w, const std::string& t) override {
    in_->require_same(w, t);
  }
  /// Each call's milliseconds, in order (average_ms: the gradients' average or reduce-scatter).
  std::vector<double> average_ms, gather_ms;

 private:
  std::shared_ptr<RankGroup> in_;
};

/// The sum of v's entries from `from` on.
inline double sum_from(const std::vector<double>& v, std::size_t from) {
  double s = 0;
  for (std::size_t i = from; i < v.size(); ++i)
    s += v[i];
  return s;
}

}  // namespace ampactor::bench
