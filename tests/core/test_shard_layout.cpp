// The sharded state's layout: contiguous shards covering every element once, balanced to within
// one granule, a pure function of the sizes, and re-sharding sources between world sizes.
#include "doctest_torch.h"

#include <ampactor/core/errors.h>
#include <ampactor/core/shard_layout.h>

#include <numeric>
#include <ostream>
#include <random>

#include "refusal.h"

namespace ampactor {
// For doctest's messages.
std::ostream& operator<<(std::ostream& o, const ShardPiece& p) {
  return o << "{" << p.param << ", " << p.offset << ", " << p.length << "}";
}
}  // namespace ampactor

using namespace ampactor;
using ampactor::test::refusal_of;

namespace {

/// Every element of every parameter, owned by exactly one rank, through pieces() and owner().
void check_covers(const ShardLayout& l) {
  std::vector<std::vector<int>> owner(l.numels().size());
  for (std::size_t p = 0; p < owner.size(); ++p)
    owner[p].assign(std::size_t(l.numels()[p]), -1);
  std::int64_t covered = 0;
  for (int r = 0; r < l.world(); ++r) {
    std::int64_t in_shard = 0;
    for (const ShardPiece& s : l.pieces(r)) {
      REQUIRE(s.length > 0);
      int twice = 0;  // elements already owned
      for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
        twice += owner[s.param][std::size_t(i)] != -1;
        owner[s.param][std::size_t(i)] = r;
      }
      CHECK(twice == 0);
      in_shard += s.length;
    }
    CHECK(in_shard == l.size(r));
    covered += in_shard;
  }
  CHECK(covered == l.total());
  for (std::size_t p = 0; p < owner.size(); ++p)
    for (std::int64_t i = 0; i < l.numels()[p]; i += std::max<std::int64_t>(1, l.numels()[p] / 7))
      CHECK(l.owner(p, i) == owner[p][std::size_t(i)]);
}

}  // namespace

TEST_CASE("shard layout: contiguous shards in rank order, every element once, balanced") {
  const ShardLayout l({10, 0, 7, 30, 1}, 3);
  CHECK(l.total() == 48);
  CHECK(l.begin(0) == 0);
  CHECK(l.end(0) == 16);
  CHECK(l.begin(1) == 16);
  CHECK(l.end(2) == 48);
  // Rank 0: parameter 0 whole, 6 of parameter 2's 7 (the empty parameter 1 has no piece).
  CHECK(l.pieces(0) == std::vector<ShardPiece>{{0, 0, 10}, {2, 0, 6}});
  CHECK(l.pieces(1) == std::vector<ShardPiece>{{2, 6, 1}, {3, 0, 15}});
  CHECK(l.pieces(2) == std::vector<ShardPiece>{{3, 15, 15}, {4, 0, 1}});
  CHECK(l.owner(3, 14) == 1);
  CHECK(l.owner(3, 15) == 2);
  check_covers(l);
}

TEST_CASE("shard layout: equal slots on granules, the rest in the last shards, on random sizes") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::int64_t> numels(1 + rng() % 9);
    for (auto& n : numels)
      n = std::int64_t(rng() % 5 == 0 ? 0 : rng() % 3000);
    const int world = 1 + int(rng() % 8);
    const std::int64_t granule = 1 + std::int64_t(rng() % 300);
    const ShardLayout l(numels, world, granule);
    CAPTURE(l.str());
    // The slot: the whole granules split evenly, rounded up.
    const std::int64_t granules = (l.total() + granule - 1) / granule;
    CHECK(l.slot() == (granules + world - 1) / world * granule);
    for (int r = 0; r < world; ++r) {
      CHECK(l.begin(r) <= l.end(r));
      if (r > 0) CHECK(l.begin(r) == l.end(r - 1));
      CHECK(l.begin(r) == std::min(l.total(), r * l.slot()));
      CHECK(l.size(r) == std::max<std::int64_t>(0, std::min(l.slot(), l.total() - r * l.slot())));
    }
    // Balanced: no shard holds more than a granule more than an even split would.
    CHECK(l.slot() * world - l.total() < std::int64_t(world) * granule);
    check_covers(l);
    // A pure function: the same inputs, the same layout.
    CHECK(ShardLayout(numels, world, granule) == l);
  }
}

TEST_CASE("shard layout: more ranks than granules leaves the last ranks empty, nothing lost") {
  const ShardLayout l({5}, 4, 2);  // granules of 2: 3 of them for 4 ranks, a slot each
  std::int64_t total = 0;
  int empty = 0;
  for (int r = 0; r < 4; ++r) {
    total += l.size(r);
    empty += l.pieces(r).empty();
  }
  CHECK(total == 5);
  CHECK(empty == 1);
  check_covers(l);
  const ShardLayout none({}, 2);
  CHECK(none.total() == 0);
  CHECK(none.pieces(1).empty());
}

TEST_CASE("shard layout: re-sharding N -> M names the old ranks of every element, and back") {
  const std::vector<std::int64_t> numels = {100, 37, 0, 250, 13};
  for (int n : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(m);
      const ShardLayout from(numels, n, 8), to(numels, m, 16);
      std::int64_t covered = 0;
      for (int r = 0; r < m; ++r) {
        std::int64_t at = to.begin(r);
        for (const ShardSource& s : to.sources(r, from)) {
          CHECK(s.begin == at);  // contiguous, in flat order
          CHECK(s.begin >= from.begin(s.rank));
          CHECK(s.end <= from.end(s.rank));
          at = s.end;
          covered += s.end - s.begin;
        }
        CHECK(at == to.end(r));
      }
      CHECK(covered == from.total());
    }
}

TEST_CASE("shard layout: bad inputs refused with what is wrong") {
  CHECK(refusal_of([] { ShardLayout({1}, 0); }).what.find("world size must be >= 1") !=
        std::string::npos);
  CHECK(refusal_of([] { ShardLayout({1}, 2, 0); }).what.find("granule must be >= 1") !=
        std::string::npos);
  CHECK(refusal_of([] {
          ShardLayout({3, -1}, 2);
        }).what.find("parameter 1 has -1 elements") != std::string::npos);
  CHECK(refusal_of([] {
          ShardLayout({INT64_MAX, 1}, 2);
        }).what.find("overflow") != std::string::npos);
  const ShardLayout l({4}, 2);
  CHECK(refusal_of([&] { (void)l.pieces(2); }).code == errc::bad_option);
  CHECK(refusal_of([&] { (void)l.owner(0, 4); }).what.find("no element 4") != std::string::npos);
  CHECK(refusal_of([&] {
          (void)l.sources(0, ShardLayout({5}, 2));
        }).what.find("different parameters") != std::string::npos);
}
