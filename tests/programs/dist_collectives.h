// ampactor-dist-worker's checks of RankGroup's gradient collectives on a real group, and a group
// that counts them (which collective a pipeline made is part of what the tests assert).
#pragma once

#include <ampactor/scaler/ranks.h>

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ampactor::test {

/// Passes every call on to `inner`, counting the gradient averages and reduce-scatters.
class CountingRanks final : public RankGroup {
 public:
  explicit CountingRanks(std::shared_ptr<RankGroup> inner) : in_(std::move(inner)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  void all_max(float* v, int n) override { in_->all_max(v, n); }
  void average(std::vector<at::Tensor>& t, float* v, int n) override {
    ++averages;
    in_->average(t, v, n);
  }
  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds, float* v,
                      int n) override {
    ++reduce_scatters;
    in_->reduce_scatter(part, bounds, v, n);
  }
  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    in_->all_gather(mine, gathered);
  }
  void fail(const std::string& why) noexcept override { in_->fail(why); }
  void require_same(const std::string& w, const std::string& t) override {
    in_->require_same(w, t);
  }
  int averages = 0, reduce_scatters = 0;

 private:
  std::shared_ptr<RankGroup> in_;
};

/// On every rank of `ranks` at once: average and reduce_scatter against sums made here in rank
/// order, on values whose sum depends on the order; uneven and empty cuts; the maxima agreed;
/// bad bounds refused before any collective. Writes one "<check> ok" or "<check> FAILED: why"
/// line each, and "order matters yes|no" (whether another order would have given other floats).
void check_collectives(RankGroup& ranks, std::ostream& out);

}  // namespace ampactor::test
