// The sums in rank order (rank_sum.h) and the pieces of RankGroup::average that need no group.
#include "rank_sum.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <utility>

namespace ampactor::dist::detail {

std::vector<std::int64_t> even_bounds(std::int64_t n, int size) {
  std::vector<std::int64_t> b(std::size_t(size) + 1, 0);
  for (int r = 0; r < size; ++r)
    b[std::size_t(r) + 1] = b[std::size_t(r)] + n / size + (r < n % size ? 1 : 0);
  return b;
}

RankOrderSum::RankOrderSum(at::Tensor part, std::vector<std::int64_t> bounds, int rank, int size)
    : part_(std::move(part)), bounds_(std::move(bounds)), rank_(rank), size_(size) {}

void RankOrderSum::start(c10d::ProcessGroup& pg, std::chrono::milliseconds timeout) {
  const std::int64_t mine = cut(rank_);
  // An empty cut still takes part (it sends the others theirs); its buffer gets a storage of
  // one element, as a backend may refuse a null pointer.
  received_ = at::empty({std::max<std::int64_t>(mine * size_, 1)}, part_.options())
                  .narrow(0, 0, mine * size_);
  std::vector<std::int64_t> out(std::size_t(size_), mine), in;
  for (int r = 0; r < size_; ++r)
    in.push_back(cut(r));
  c10d::AllToAllOptions o;
  o.timeout = timeout;
  exchange_ = pg.alltoall_base(received_, part_, out, in, o);
}

void RankOrderSum::finish(std::chrono::milliseconds timeout) {
  exchange_->wait(timeout);
  const std::int64_t m = cut(rank_);
  if (m == 0) return;
  at::Tensor own = part_.narrow(0, bounds_[std::size_t(rank_)], m);
  auto from = [&](int r) { return received_.narrow(0, r * m, m); };
  if (size_ == 1) return own.copy_(from(0)), void();
  at::add_out(own, from(0), from(1));  // ((r0 + r1) + r2) + ...: one rounding per add
  for (int r = 2; r < size_; ++r)
    own.add_(from(r));
  received_ = at::Tensor();
}

std::vector<c10::intrusive_ptr<c10d::Work>> broadcast_cuts(c10d::ProcessGroup& pg,
                                                           const at::Tensor& part,
                                                           const std::vector<std::int64_t>& bounds,
                                                           std::chrono::milliseconds timeout) {
  c10d::BroadcastOptions o;
  o.timeout = timeout;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
    if (bounds[r + 1] == bounds[r]) continue;
    std::vector<at::Tensor> piece{part.narrow(0, bounds[r], bounds[r + 1] - bounds[r])};
    o.rootRank = int(r);
    works.push_back(pg.broadcast(piece, o));
  }
  return works;
}

void RankOrderSum::start_gather(c10d::ProcessGroup& pg, std::chrono::milliseconds timeout) {
  gathers_ = broadcast_cuts(pg, part_, bounds_, timeout);
}

void RankOrderSum::wait_gather(std::chrono::milliseconds timeout) {
  for (auto& w : gathers_)
    w->wait(timeout);
  gathers_.clear();
}

std::vector<Bucket> bucket(const std::vector<at::Tensor>& tensors, std::int64_t bucket_bytes) {
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const std::int64_t b = t.numel() * std::int64_t(t.element_size());
    Bucket* into = nullptr;
    for (Bucket& k : buckets) {
      const at::Tensor& first = tensors[k.members[0]];
      if (first.scalar_type() == t.scalar_type() && first.device() == t.device() &&
          k.bytes + b <= bucket_bytes)
        into = &k;
    }
    if (!into) into = &buckets.emplace_back();
    into->members.push_back(i);
    into->bytes += b;
  }
  return buckets;
}

at::Tensor max_slots(const float* max_values, int n, int rank, int size, bool cuda) {
  at::Tensor slots;
  if (n > 0) {
    std::vector<float> host(std::size_t(n) * std::size_t(size), 0.0f);
    for (int i = 0; i < n; ++i)
      host[std::size_t(i) * std::size_t(size) + std::size_t(rank)] = max_values[i];
    slots = at::from_blob(host.data(), {std::int64_t(host.size())}, at::kFloat).clone();
    if (cuda) slots = slots.to(at::kCUDA);
  }
  return slots;
}

void read_maxima(const at::Tensor& summed, const at::Tensor& slots, float* max_values, int n,
                 int size) {
  const at::Tensor s = summed.narrow(0, summed.numel() - slots.numel(), slots.numel()).cpu();
  const float* p = s.contiguous().data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    float m = p[std::size_t(i) * std::size_t(size)];
    for (int r = 1; r < size; ++r)
      m = std::max(m, p[std::size_t(i) * std::size_t(size) + std::size_t(r)]);
    max_values[i] = m;
  }
}

void unflatten_mean(std::vector<Bucket>& buckets, std::vector<at::Tensor>& tensors, int size) {
  for (Bucket& k : buckets) {
    k.flat.div_(double(size));
    std::int64_t at = 0;
    for (std::size_t i : k.members) {
      at::Tensor& t = tensors[i];
      t.copy_(k.flat.slice(0, at, at + t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

}  // namespace ampactor::dist::detail
