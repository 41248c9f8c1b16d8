// One rank alone as a RankGroup: what the pipeline's rank paths need of a group, in one process
// (the average of one rank is its own gradient, the all-gather its own slot). It counts the
// averages asked of it, so that a test can tell a path that averages from one that does not.
#pragma once

#include <ampactor/scaler/ranks.h>

#include <string>
#include <vector>

namespace ampactor::test {

struct SoloRanks final : RankGroup {
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_max(float*, int) override {}
  void average(std::vector<at::Tensor>&, float*, int) override { ++averages; }
  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    if (!mine.is_same(gathered)) gathered.narrow(0, 0, mine.numel()).copy_(mine);
  }
  void fail(const std::string&) noexcept override {}
  void require_same(const std::string&, const std::string&) override {}
  int averages = 0;
};

}  // namespace ampactor::test
