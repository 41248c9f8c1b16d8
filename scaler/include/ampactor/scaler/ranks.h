// What a data-parallel scaler needs from its ranks: found_inf agreed across them, gradients
// averaged across them, and failures named. ampactor::dist implements it over a c10d process
// group (<ampactor/distributed/dist.h>); a scaler gets one through GradScalerOptions::ranks().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ampactor {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// values[i] becomes the largest values[i] of all ranks. Every rank makes the same calls in the
  /// same order (one per unscale of each optimizer). A rank that died, failed or cannot be
  /// reached makes it throw ScalerError(errc::rank_failed) naming that rank, within the group's
  /// timeout.
  virtual void all_max(float* values, int n) = 0;
  /// Each tensor becomes the mean of that tensor over the ranks, in its own dtype (the pipeline
  /// hands fp32 master gradients), and max_values[0..n) become their maximum over the ranks as
  /// all_max's do, in the same round of collectives (the pipeline agrees found_inf there). Same
  /// calling rule and errors as all_max. ampactor::dist's group sums each element in rank order,
  /// then divides by size(), whatever the backend: the mean reduce_scatter gives (with two
  /// ranks every order is the one addition, and the backend's all-reduce makes it).
  virtual void average(std::vector<at::Tensor>& tensors, float* max_values = nullptr,
                       int n = 0) = 0;
  /// The sharded state's reduce-scatter. `part`: a contiguous 1-D tensor of the same length on
  /// every rank; `bounds`: size() + 1 offsets into it, from 0 to its length, nondecreasing, the
  /// same on every rank. Rank r's cut [bounds[r], bounds[r + 1]) of `part` becomes its mean over
  /// the ranks: the floats average() gives there. The rest of `part` is left unspecified.
  /// max_values as average's. Same calling rule and errors as all_max. This default averages
  /// the whole of `part` (correct, with all of average's traffic); ampactor::dist's group sends
  /// each rank only its cut.
  virtual void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds,
                              float* max_values = nullptr, int n = 0);
  /// The sharded optimizer state's weights: `mine` (a contiguous 1-D tensor of bytes, kByte,
  /// the same length on every rank) from each rank, in rank order, into `gathered` (contiguous,
  /// length size() x mine's; rank r's at [r x n, (r + 1) x n)); `mine` may be this rank's part
  /// of `gathered` itself. Same calling rule and errors as all_max.
  virtual void all_gather(const at::Tensor& mine, at::Tensor& gathered) = 0;
  /// A ring shift of bytes: `mine` (a contiguous 1-D kByte tensor, of any length) goes to rank
  /// (rank() + by) % size(), and `theirs` becomes rank (rank() - by) % size()'s, resized to its
  /// length. `by` in [1, size()), the same on every rank. Same calling rule and errors as
  /// all_max. This default all-gathers every rank's bytes; ampactor::dist's group sends and
  /// receives only these two.
  virtual void shift(const at::Tensor& mine, int by, at::Tensor& theirs);
  /// shift, with rank (rank() - by) % size()'s bytes handed to `take` in order, in pieces of at
  /// most `piece` bytes (>= 1, the same on every rank), as they arrive: ampactor::dist's group
  /// receives into two buffers of that size, so a large transfer is written out of a buffer
  /// still in cache. If `take` throws, it is handed nothing more, the rest is still received (no
  /// rank waits on this one), and then its exception is rethrown. This default shifts, then hands
  /// out the pieces.
  virtual void shift_pieces(const at::Tensor& mine, int by, std::int64_t piece,
                            const std::function<void(const char* data, std::size_t n)>& take);
  /// Tells the other ranks that this one failed and why, so that their errors name it and its
  /// reason. Never throws.
  virtual void fail(const std::string& why) noexcept = 0;
  /// Throws ScalerError(errc::bad_option) on every rank unless all ranks pass the same `text`
  /// for the same `what` (e.g. a scaler's options): the first difference is named with both
  /// ranks' values. Waits for every rank (within the timeout).
  virtual void require_same(const std::string& what, const std::string& text) = 0;
};

/// A RankGroup that passes every call on to another: derive from it to watch some of them (a
/// bench times the collectives, a test counts them) and call the base to pass them on.
class ForwardingRanks : public RankGroup {
 public:
  explicit ForwardingRanks(std::shared_ptr<RankGroup> inner) : in_(std::move(inner)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  void all_max(float* values, int n) override { in_->all_max(values, n); }
  void average(std::vector<at::Tensor>& tensors, float* max_values = nullptr, int n = 0) override {
    in_->average(tensors, max_values, n);
  }
  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds,
                      float* max_values = nullptr, int n = 0) override {
    in_->reduce_scatter(part, bounds, max_values, n);
  }
  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    in_->all_gather(mine, gathered);
  }
  void shift(const at::Tensor& mine, int by, at::Tensor& theirs) override {
    in_->shift(mine, by, theirs);
  }
  void shift_pieces(const at::Tensor& mine, int by, std::int64_t piece,
                    const std::function<void(const char*, std::size_t)>& take) override {
    in_->shift_pieces(mine, by, piece, take);
  }
  void fail(const std::string& why) noexcept override { in_->fail(why); }
  void require_same(const std::string& what, const std::string& text) override {
    in_->require_same(what, text);
  }

 private:
  std::shared_ptr<RankGroup> in_;
};

/// How a grad move reduces the moved gradients across the ranks, with the values to agree (as
/// RankGroup::average takes them). Unset: RankGroup::average of the moved gradients; the sharded
/// optimizer state reduce-scatters its own flat buffer instead.
using GradReduce = std::function<void(std::vector<at::Tensor>& moved, float* max_values, int n)>;

/// The values the ranks agree on for one check, as all_max takes them: found_inf, the largest
/// gradient size, then one flag per rank (each rank sets its own), so every rank learns which
/// ranks found inf or NaN in the same collective.
std::vector<float> agreement_values(const RankGroup& ranks, bool local_found_inf, double grad_max);
/// The ranks whose flag is set in agreed values.
std::vector<std::int32_t> ranks_that_found(const std::vector<float>& agreed);
/// reduce_scatter's arguments, checked: ScalerError(errc::protocol_misuse) naming what is wrong.
/// RankGroup::shift's checks (ScalerError(errc::protocol_misuse)), for its implementations.
void check_shift(const RankGroup& ranks, const at::Tensor& mine, int by);
/// RankGroup::shift_pieces's checks: check_shift's, and `piece` >= 1.
void check_shift_pieces(const RankGroup& ranks, const at::Tensor& mine, int by, std::int64_t piece);
void check_reduce_scatter(const RankGroup& ranks, const at::Tensor& part,
                          const std::vector<std::int64_t>& bounds);

}  // namespace ampactor
