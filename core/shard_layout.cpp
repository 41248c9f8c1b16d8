#include <ampactor/core/errors.h>
#include <ampactor/core/shard_layout.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace ampactor {

namespace {
[[noreturn]] void bad(const std::string& what) {
  throw ScalerError(errc::bad_option, "ShardLayout: " + what);
}
}  // namespace

ShardLayout::ShardLayout(std::vector<std::int64_t> numels, int world, std::int64_t granule)
    : numels_(std::move(numels)), world_(world), granule_(granule) {
  if (world < 1) bad("the world size must be >= 1, got " + std::to_string(world));
  if (granule < 1) bad("the granule must be >= 1, got " + std::to_string(granule));
  starts_.reserve(numels_.size());
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    if (numels_[i] < 0)
      bad("parameter " + std::to_string(i) + " has " + std::to_string(numels_[i]) + " elements");
    if (numels_[i] > std::numeric_limits<std::int64_t>::max() - total_)
      bad("the parameters' elements overflow int64");
    starts_.push_back(total_);
    total_ += numels_[i];
  }
  const std::int64_t granules = total_ / granule_ + (total_ % granule_ != 0);
  slot_ = (granules / world_ + (granules % world_ != 0)) * granule_;
}

void ShardLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_)
    bad("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_) + ")");
}

std::int64_t ShardLayout::begin(int rank) const {
  check_rank(rank);
  // Equal slots (the last granule may be short), so that every shard sits at rank x slot.
  return std::min(total_, std::int64_t(rank) * slot_);
}

std::int64_t ShardLayout::end(int rank) const {
  check_rank(rank);
  return rank + 1 == world_ ? total_ : begin(rank + 1);
}

std::vector<ShardPiece> ShardLayout::pieces(int rank) const {
  const std::int64_t b = begin(rank), e = end(rank);
  std::vector<ShardPiece> out;
  // The first parameter that ends after b.
  auto it = std::upper_bound(starts_.begin(), starts_.end(), b);
  std::size_t p = it == starts_.begin() ? 0 : std::size_t(it - starts_.begin() - 1);
  for (; p < numels_.size() && starts_[p] < e; ++p) {
    const std::int64_t from = std::max(b, starts_[p]);
    const std::int64_t to = std::min(e, starts_[p] + numels_[p]);
    if (to > from) out.push_back({p, from - starts_[p], to - from});
  }
  return out;
}

int ShardLayout::owner(std::size_t param, std::int64_t offset) const {
  if (param >= numels_.size() || offset < 0 || offset >= numels_[param])
    bad("parameter " + std::to_string(param) + " has no element " + std::to_string(offset));
  const std::int64_t flat = starts_[param] + offset;
  // The last rank whose shard begins at or before it (empty shards before it are skipped).
  int lo = 0, hi = world_ - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (begin(mid) <= flat)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

std::vector<ShardSource> ShardLayout::sources(int rank, const ShardLayout& from) const {
  if (from.numels_ != numels_)
    bad("cannot re-shard between different parameters (" + from.str() + " and " + str() + ")");
  const std::int64_t b = begin(rank), e = end(rank);
  std::vector<ShardSource> out;
  for (int r = 0; r < from.world_; ++r) {
    const std::int64_t lo = std::max(b, from.begin(r)), hi = std::min(e, from.end(r));
    if (hi > lo) out.push_back({r, lo, hi});
  }
  return out;
}

std::string ShardLayout::str() const {
  std::ostringstream o;
  o << "world " << world_ << ", granule " << granule_ << ", " << numels_.size() << " parameters, "
    << total_ << " elements";
  return o.str();
}

}  // namespace ampactor
