// What the data-parallel paths share with the sharded state, in one process: the squares of a
// parameter cut by the shard layout (clipping's norm, sharded or not), and RankGroup's default
// reduce_scatter with its checks.
#include <doctest/doctest.h>

#include <ampactor/core/errors.h>
#include <ampactor/core/shard_layout.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <string>
#include <vector>

using namespace ampactor;

TEST_CASE(
    "piece_square: a parameter the layout cuts is the sum of its pieces' squared norms in flat "
    "order, one in a single piece its own squared norm or the measured value") {
  // 3 ranks over 10 + 7 + 5 elements: parameter 0 ends inside rank 1's shard, parameter 1 spans
  // ranks 1 and 2.
  const ShardLayout layout({10, 7, 5}, 3);
  const std::vector<at::Tensor> grads = {at::randn({2, 5}), at::randn({7}), at::randn({5})};
  for (std::size_t p = 0; p < grads.size(); ++p) {
    CAPTURE(p);
    std::vector<double> pieces;
    const std::int64_t first = layout.start(p);
    for (int r = 0; r < 3; ++r) {
      const std::int64_t lo = std::max(first, layout.begin(r));
      const std::int64_t hi = std::min(first + grads[p].numel(), layout.end(r));
      if (lo < hi)
        pieces.push_back(squared_norm(grads[p].reshape({-1}).narrow(0, lo - first, hi - lo)));
    }
    double want = pieces[0];
    for (std::size_t k = 1; k < pieces.size(); ++k)
      want += pieces[k];
    CHECK(piece_square(grads[p], layout, p) == want);
    if (pieces.size() == 1) {
      CHECK(piece_square(grads[p], layout, p) == squared_norm(grads[p]));
      CHECK(piece_square(grads[p], layout, p, 2.5) == 2.5);  // measured already
    } else {
      CHECK(piece_square(grads[p], layout, p, 2.5) == want);  // cut: measured piece by piece
    }
  }
  std::int64_t cut = 0;
  for (std::size_t p = 0; p < grads.size(); ++p)
    cut += layout.owner(p, 0) != layout.owner(p, grads[p].numel() - 1);
  CHECK(cut >= 1);  // the layout does cut a parameter
  // A transposed gradient: measured in its row-major order, as its parameter's elements lie.
  const at::Tensor t = at::randn({5, 2}).t();
  CHECK(piece_square(t, layout, 0) == piece_square(t.contiguous(), layout, 0));
}

TEST_CASE("norm_of_squares is global_norm's sum in order, then the square root times mult") {
  const std::vector<at::Tensor> grads = {at::randn({9}), at::Tensor(), at::randn({3, 3})};
  const std::vector<double> squares = {squared_norm(grads[0]), squared_norm(grads[2])};
  CHECK(norm_of_squares(squares, 0.5) == global_norm(grads, 0.5));
  CHECK(norm_of_squares({}) == 0.0);
}

namespace {
/// Two ranks as rank 0 sees them: average() sets each tensor to 42, counting the calls.
struct FakeRanks final : RankGroup {
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_max(float*, int) override {}
  void average(std::vector<at::Tensor>& t, float* v, int n) override {
    ++averages;
    for (at::Tensor& x : t)
      x.fill_(42);
    for (int i = 0; i < n; ++i)
      v[i] = 7;
  }
  void all_gather(const at::Tensor&, at::Tensor&) override {}
  void fail(const std::string&) noexcept override {}
  void require_same(const std::string&, const std::string&) override {}
  int averages = 0;
};
}  // namespace

TEST_CASE(
    "RankGroup::reduce_scatter by default averages the whole part, and bad bounds are refused "
    "naming what is wrong with nothing averaged") {
  FakeRanks ranks;
  at::Tensor part = at::arange(10, at::kFloat);
  float v[2] = {1, 2};
  ranks.reduce_scatter(part, {0, 4, 10}, v, 2);
  CHECK(ranks.averages == 1);
  CHECK(part.equal(at::full({10}, 42.0f)));
  CHECK(v[1] == 7);

  struct Bad {
    at::Tensor part;
    std::vector<std::int64_t> bounds;
    std::string said;
  };
  const at::Tensor fresh = at::arange(10, at::kFloat);
  const std::vector<Bad> bad = {
      {fresh.clone(), {0, 10}, "2 bounds for 2 ranks"},
      {fresh.clone(), {1, 4, 10}, "from 0 to the part's 10 elements"},
      {fresh.clone(), {0, 4, 9}, "from 0 to the part's 10 elements"},
      {fresh.clone(), {0, 11, 10}, "must not decrease"},
      {fresh.clone().view({2, 5}), {0, 4, 10}, "contiguous 1-D"},
      {at::arange(20, at::kFloat).slice(0, 0, 20, 2), {0, 4, 10}, "contiguous 1-D"}};
  for (const Bad& b : bad) {
    CAPTURE(b.said);
    at::Tensor p = b.part;
    const at::Tensor before = p.clone();
    try {
      ranks.reduce_scatter(p, b.bounds);
      FAIL("not refused");
    } catch (const ScalerError& e) {
      CHECK(e.code() == errc::protocol_misuse);
      CHECK_MESSAGE(std::string(e.what()).find(b.said) != std::string::npos, e.what());
    }
    CHECK(p.equal(before));
  }
  CHECK(ranks.averages == 1);
}
