// Inside ampactor::distributed: the sums in rank order behind RankGroup's average and
// reduce_scatter. An all-to-all brings each rank every rank's cut of a buffer and the rank adds
// them in rank order, so a mean is the same floats on every backend, in every bucketing and
// sharded or not (a ring all-reduce's order depends on the ring and the chunking); for average,
// one broadcast per cut then brings every sum to every rank. The traffic is a ring all-reduce's.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace ampactor::dist::detail {

/// n elements cut evenly into `size` parts, the first ones one longer: size + 1 offsets.
std::vector<std::int64_t> even_bounds(std::int64_t n, int size);

/// Starts one broadcast per non-empty cut [bounds[r], bounds[r + 1]) of `part`, from rank r into
/// every rank's `part`, all in flight at once, in the same order on every rank: an all-gather in
/// place (gloo's own gathers into a buffer of its own, the whole size each call, and copies).
std::vector<c10::intrusive_ptr<c10d::Work>> broadcast_cuts(c10d::ProcessGroup& pg,
                                                           const at::Tensor& part,
                                                           const std::vector<std::int64_t>& bounds,
                                                           std::chrono::milliseconds timeout);

/// One buffer's reduce-scatter, then (for average) its all-gather: start, finish, and
/// optionally start_gather and wait_gather, each in the same order on every rank.
class RankOrderSum {
 public:
  /// `part`: contiguous, 1-D, the same length on every rank; `bounds`: the cuts (even_bounds, or
  /// the shards'). Nothing is sent before start().
  RankOrderSum(at::Tensor part, std::vector<std::int64_t> bounds, int rank, int size);
  /// Starts the all-to-all that brings every rank's cut of `part` for this rank here.
  void start(c10d::ProcessGroup& pg, std::chrono::milliseconds timeout);
  /// Waits for it, then writes the cuts' sum, added in rank order, into this rank's cut of
  /// `part` (the rest of `part` is as it was).
  void finish(std::chrono::milliseconds timeout);
  /// After finish on every rank: one broadcast per non-empty cut, from the rank that summed it,
  /// into every rank's `part`.
  void start_gather(c10d::ProcessGroup& pg, std::chrono::milliseconds timeout);
  void wait_gather(std::chrono::milliseconds timeout);

 private:
  std::int64_t cut(int r) const { return bounds_[std::size_t(r) + 1] - bounds_[std::size_t(r)]; }
  at::Tensor part_, received_;
  std::vector<std::int64_t> bounds_;
  int rank_, size_;
  c10::intrusive_ptr<c10d::Work> exchange_;
  std::vector<c10::intrusive_ptr<c10d::Work>> gathers_;
};

/// average's buckets: tensors of one dtype and device, flattened into one buffer each.
struct Bucket {
  std::vector<std::size_t> members;
  std::int64_t bytes = 0;
  at::Tensor flat;
};

/// Each tensor goes into the last bucket of its dtype and device with room for it, else a new one.
std::vector<Bucket> bucket(const std::vector<at::Tensor>& tensors, std::int64_t bucket_bytes);

/// The maxima travel in a sum: rank r's values in its own slots, zeros in the others' (x + 0 is
/// x exactly), the largest slot taken after (read_maxima). Undefined when n is 0.
at::Tensor max_slots(const float* max_values, int n, int rank, int size, bool cuda);

/// Takes each value's largest slot from the summed slots (the last slots.numel() elements of
/// `summed`).
void read_maxima(const at::Tensor& summed, const at::Tensor& slots, float* max_values, int n,
                 int size);

/// The summed buckets divided by the rank count, copied back into their tensors.
void unflatten_mean(std::vector<Bucket>& buckets, std::vector<at::Tensor>& tensors, int size);

}  // namespace ampactor::dist::detail
