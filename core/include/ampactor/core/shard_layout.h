// The layout of a sharded optimizer state: the parameters' elements, in parameter order, as one
// flat range cut into one contiguous shard per rank. A pure function of the parameters' sizes,
// the world size and the granule, so every rank computes the same layout without talking, and a
// checkpoint can name it and be re-sharded to another world size. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ampactor {

/// A contiguous piece of one parameter (its elements in row-major order).
struct ShardPiece {
  std::size_t param = 0;    // the parameter's index
  std::int64_t offset = 0;  // the first element of the piece in that parameter
  std::int64_t length = 0;
  bool operator==(const ShardPiece& o) const {
    return param == o.param && offset == o.offset && length == o.length;
  }
};

/// A part of the flat range held by one rank of a layout (for re-sharding).
struct ShardSource {
  int rank = 0;
  std::int64_t begin = 0, end = 0;  // flat elements [begin, end)
  bool operator==(const ShardSource& o) const {
    return rank == o.rank && begin == o.begin && end == o.end;
  }
};

class ShardLayout {
 public:
  /// numels: each parameter's element count (>= 0); world: the ranks (>= 1); granule: shard
  /// boundaries fall on multiples of it (>= 1). Every rank's shard is one slot of slot()
  /// elements (the whole granules split evenly, rounded up), but for the last ones, which hold
  /// what is left: a flat buffer of world() x slot() elements holds every shard at r x slot(),
  /// so an all-gather of equal slots needs no copy. Bad values: ScalerError(errc::bad_option).
  ShardLayout(std::vector<std::int64_t> numels, int world, std::int64_t granule = 1);

  int world() const { return world_; }
  std::int64_t granule() const { return granule_; }
  const std::vector<std::int64_t>& numels() const { return numels_; }
  /// All elements of all parameters.
  std::int64_t total() const { return total_; }
  /// The elements of each rank's slot.
  std::int64_t slot() const { return slot_; }
  /// Parameter p's first element in the flat range.
  std::int64_t start(std::size_t param) const { return starts_.at(param); }
  /// Rank r's shard is the flat elements [begin(r), end(r)); empty when there are fewer granules
  /// than ranks. ScalerError(errc::bad_option) for a rank outside [0, world).
  std::int64_t begin(int rank) const;
  std::int64_t end(int rank) const;
  std::int64_t size(int rank) const { return end(rank) - begin(rank); }
  /// Rank r's shard as pieces of parameters, in parameter order (empty parameters have none).
  std::vector<ShardPiece> pieces(int rank) const;
  /// The rank whose shard holds element `offset` of parameter `param`.
  int owner(std::size_t param, std::int64_t offset) const;
  /// Where rank r of this layout finds its elements in `from` (another world size or granule,
  /// the same parameters): the parts of `from`'s shards it overlaps, in flat order.
  /// ScalerError(errc::bad_option) when the parameters differ.
  std::vector<ShardSource> sources(int rank, const ShardLayout& from) const;
  /// "world 4, granule 1024, 3 parameters, 600 elements": names the layout in errors and manifests.
  std::string str() const;
  bool operator==(const ShardLayout& o) const {
    return world_ == o.world_ && granule_ == o.granule_ && numels_ == o.numels_;
  }
  bool operator!=(const ShardLayout& o) const { return !(*this == o); }

 private:
  void check_rank(int rank) const;
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> starts_;  // each parameter's first flat element
  int world_;
  std::int64_t granule_;
  std::int64_t total_ = 0;
  std::int64_t slot_ = 0;
};

}  // namespace ampactor
