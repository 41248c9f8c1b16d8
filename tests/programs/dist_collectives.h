// ampactor-dist-worker's checks of RankGroup's gradient collectives on a real group, and a group
// that counts them (which collective a pipeline made is part of what the tests assert).
#pragma once

#include <ampactor/scaler/ranks.h>

#include <cstdint>
#include <ostream>
#include <vector>

namespace ampactor::test {

/// Passes every call on, counting the gradient averages and reduce-scatters.
class CountingRanks final : public ForwardingRanks {
 public:
  using ForwardingRanks::ForwardingRanks;
  void average(std::vector<at::Tensor>& t, float* v, int n) override {
    ++averages;
    ForwardingRanks::average(t, v, n);
  }
  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds, float* v,
                      int n) override {
    ++reduce_scatters;
    ForwardingRanks::reduce_scatter(part, bounds, v, n);
  }
  int averages = 0, reduce_scatters = 0;
};

/// On every rank of `ranks` at once: average and reduce_scatter against sums made here in rank
/// order, on values whose sum depends on the order; uneven and empty cuts; the maxima agreed;
/// bad bounds refused before any collective. Writes one "<check> ok" or "<check> FAILED: why"
/// line each, and "order matters yes|no" (whether another order would have given other floats).
void check_collectives(RankGroup& ranks, std::ostream& out);

}  // namespace ampactor::test
