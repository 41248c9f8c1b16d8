// RankGroup over c10d: MAX all-reduces for found_inf, bucketed averages for gradients, and the
// store for what a collective cannot say: which rank failed, and why.
#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include "watch.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sstream>
#include <utility>
#include <vector>

namespace ampactor::dist {

#define AMPACTOR_DIST_POSITIVE(T, name)                                          \
  DistOptions& DistOptions::name(T value) {                                      \
    if (value.count() <= 0)                                                      \
      throw ScalerError(errc::bad_option, "DistOptions::" #name " must be > 0"); \
    name##_ = value;                                                             \
    return *this;                                                                \
  }
AMPACTOR_DIST_POSITIVE(std::chrono::milliseconds, timeout)
AMPACTOR_DIST_POSITIVE(std::chrono::milliseconds, heartbeat)
#undef AMPACTOR_DIST_POSITIVE

DistOptions& DistOptions::bucket_bytes(std::int64_t value) {
  if (value <= 0) throw ScalerError(errc::bad_option, "DistOptions::bucket_bytes must be > 0");
  bucket_bytes_ = value;
  return *this;
}

namespace {

using detail::bytes_of;
using detail::key;
using detail::string_of;

/// The first "name=value" word that differs between two describe() texts, as "a vs b".
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string wa, wb;
  while (true) {
    const bool ha = bool(sa >> wa), hb = bool(sb >> wb);
    if (!ha && !hb) return "(equal)";
    if (!ha || !hb || wa != wb) return (ha ? wa : "(nothing)") + " vs " + (hb ? wb : "(nothing)");
  }
}

// The pieces of C10dRanks::average that need no member.

/// The maxima travel in the same round as a SUM: rank r's values in its own slots, zeros in
/// the others' (x + 0 is x exactly), the largest slot taken after. Undefined when n is 0.
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

/// Buckets of one dtype and device, each flattened into one buffer, all in flight at once.
struct Bucket {
  std::vector<std::size_t> members;
  std::int64_t bytes = 0;
  at::Tensor flat;
  c10::intrusive_ptr<c10d::Work> work;
};

/// Each tensor goes into the last bucket of its dtype and device with room for it, else a new one.
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

/// Takes each value's largest slot from the summed slots (at the carrier's end, if any).
void read_maxima(const at::Tensor& slots, const Bucket* carrier, float* max_values, int n,
                 int size) {
  at::Tensor summed =
      carrier ? carrier->flat.slice(0, carrier->flat.numel() - slots.numel()) : slots;
  summed = summed.cpu().contiguous();
  const float* p = summed.data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    float m = p[std::size_t(i) * std::size_t(size)];
    for (int r = 1; r < size; ++r)
      m = std::max(m, p[std::size_t(i) * std::size_t(size) + std::size_t(r)]);
    max_values[i] = m;
  }
}

/// The summed buckets divided by the rank count, copied back into their tensors.
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

/// over()'s arguments, checked before any rank waits for the others.
void check_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                 const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
  if (!pg || !store)
    throw ScalerError(errc::bad_option, "ampactor::dist::over: no process group or store");
  if (size < 1 || rank < 0 || rank >= size)
    throw ScalerError(errc::bad_option, "ampactor::dist::over: rank " + std::to_string(rank) +
                                            " of " + std::to_string(size) + " ranks");
  if (pg->getRank() != rank || pg->getSize() != size)
    throw ScalerError(errc::bad_option, "ampactor::dist::over: the process group is rank " +
                                            std::to_string(pg->getRank()) + " of " +
                                            std::to_string(pg->getSize()) + ", not " +
                                            std::to_string(rank) + " of " + std::to_string(size));
}

class C10dRanks final : public RankGroup {
 public:
  C10dRanks(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store,
            int rank, int size, DistOptions options, std::unique_ptr<detail::Watch> watch)
      : pg_(std::move(pg)),
        store_(std::move(store)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        watch_(std::move(watch)) {
    cuda_ = pg_->getBackendName() == "nccl";
  }
  // Rank 0 may wait for a stopped rank too: resumed, it reads why the others gave up.
  ~C10dRanks() override { watch_->leave(true); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_max(float* values, int n) override {
    refuse_after_failure();
    at::Tensor t = at::from_blob(values, {n}, at::kFloat).clone();
    if (cuda_) t = t.to(at::kCUDA);
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    o.timeout = options_.timeout();
    std::vector<at::Tensor> list{t};
    run("the found_inf agreement", [&] { pg_->allreduce(list, o)->wait(options_.timeout()); });
    t = list[0].cpu();
    for (int i = 0; i < n; ++i)
      values[i] = t.data_ptr<float>()[i];
  }

  void average(std::vector<at::Tensor>& tensors, float* max_values, int n) override {
    refuse_after_failure();
    if (size_ == 1) return;
    at::Tensor slots = max_slots(max_values, n, rank_, size_, cuda_);
    std::vector<Bucket> buckets = bucket(tensors, options_.bucket_bytes());
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = options_.timeout();
    // The slots ride at the end of the first fp32 bucket on their device: no round of their own
    // (a separate all-reduce, even in flight beside the buckets, costs about a round trip more).
    Bucket* carrier = nullptr;
    for (Bucket& k : buckets)
      if (!carrier && slots.defined() && tensors[k.members[0]].scalar_type() == at::kFloat &&
          tensors[k.members[0]].device() == slots.device())
        carrier = &k;
    c10::intrusive_ptr<c10d::Work> slots_work;
    run("the gradient average", [&] {
      if (slots.defined() && !carrier) {
        std::vector<at::Tensor> list{slots};
        slots_work = pg_->allreduce(list, o);
      }
      for (Bucket& k : buckets) {
        std::vector<at::Tensor> parts;
        for (std::size_t i : k.members)
          parts.push_back(tensors[i].reshape({-1}));
        if (&k == carrier) parts.push_back(slots.reshape({-1}));
        k.flat = at::cat(parts);
        std::vector<at::Tensor> list{k.flat};
        k.work = pg_->allreduce(list, o);
      }
      for (Bucket& k : buckets)
        k.work->wait(options_.timeout());
      if (slots_work) slots_work->wait(options_.timeout());
    });
    if (slots.defined()) read_maxima(slots, carrier, max_values, n, size_);
    unflatten_mean(buckets, tensors, size_);
  }

  void all_gather(const at::Tensor& mine, at::Tensor& gathered) override {
    refuse_after_failure();
    const std::int64_t n = mine.numel();
    if (mine.scalar_type() != at::kByte || mine.dim() != 1 || !mine.is_contiguous() ||
        gathered.scalar_type() != at::kByte || !gathered.is_contiguous() ||
        gathered.numel() != n * size_)
      throw ScalerError(errc::protocol_misuse,
                        "RankGroup::all_gather: a contiguous 1-D kByte tensor per rank into a "
                        "contiguous one of size() times its length");
    if (!cuda_) return gather_in_place(mine, gathered);
    at::Tensor in = mine.to(at::kCUDA);
    at::Tensor out = at::empty({n * size_}, in.options());
    std::vector<at::Tensor> parts;
    for (int r = 0; r < size_; ++r)
      parts.push_back(out.narrow(0, r * n, n));
    std::vector<std::vector<at::Tensor>> outputs{parts};
    std::vector<at::Tensor> inputs{in};
    c10d::AllgatherOptions o;
    o.timeout = options_.timeout();
    run("the sharded weights' all-gather",
        [&] { pg_->allgather(outputs, inputs, o)->wait(options_.timeout()); });
    gathered.copy_(out);
  }

  void fail(const std::string& why) noexcept override {
    failed_ = true;
    try {
      store_->set(key("failed", rank_), bytes_of(why));
      // TCPStore's set does not wait for the store; a check on the same connection is answered
      // after it, so the reason is in place before this rank stops taking part.
      store_->check({key("failed", rank_)});
    } catch (...) {
      // The store is gone too: the others will find this rank's heartbeat stopped.
    }
  }

  void require_same(const std::string& what, const std::string& text) override {
    const std::string base = "ampactor/same/" + std::to_string(same_seq_++) + "/" + what + "/";
    std::vector<std::string> texts(static_cast<std::size_t>(size_));
    try {
      store_->set(base + std::to_string(rank_), bytes_of(text));
      for (int r = 0; r < size_; ++r) {
        const std::string k = base + std::to_string(r);
        store_->wait({k}, options_.timeout());
        texts[std::size_t(r)] = string_of(store_->get(k));
      }
    } catch (const std::exception& e) {
      throw ScalerError(errc::rank_failed, "rank " + std::to_string(rank_) +
                                               ": comparing the ranks' " + what +
                                               " failed: " + watch_->diagnose(detail::brief(e)));
    }
    for (int r = 1; r < size_; ++r)
      if (texts[std::size_t(r)] != texts[0])
        throw ScalerError(errc::bad_option, "rank " + std::to_string(rank_) + ": the ranks' " +
                                                what + " differ: rank 0 has " +
                                                first_difference(texts[0], texts[std::size_t(r)]) +
                                                " on rank " + std::to_string(r) +
                                                " (every rank must start with the same)");
  }

 private:
  /// A rank whose job failed may have skipped a collective the others made: a further one could
  /// pair with theirs wrongly (gloo aborts on mismatched sizes), so it makes none.
  void refuse_after_failure() const {
    if (failed_)
      throw ScalerError(errc::rank_failed, "rank " + std::to_string(rank_) +
                                               ": this rank's step job failed, so it takes part "
                                               "in no further collective");
  }

  /// all_gather on the CPU as one broadcast per rank, each into its part of `gathered` in place:
  /// gloo's all-gather would gather into a buffer of its own (the whole size, each call) and copy.
  void gather_in_place(const at::Tensor& mine, at::Tensor& gathered) {
    const std::int64_t n = mine.numel();
    at::Tensor own = gathered.narrow(0, rank_ * n, n);
    if (own.data_ptr() != mine.data_ptr()) own.copy_(mine);
    c10d::BroadcastOptions o;
    o.timeout = options_.timeout();
    run("the sharded weights' all-gather", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (int r = 0; r < size_; ++r) {  // all in flight at once, in the same order on every rank
        std::vector<at::Tensor> part{gathered.narrow(0, r * n, n)};
        o.rootRank = r;
        works.push_back(pg_->broadcast(part, o));
      }
      for (auto& w : works)
        w->wait(options_.timeout());
    });
  }

  template <class F>
  void run(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw ScalerError(errc::rank_failed, "rank " + std::to_string(rank_) + ": " + what +
                                               " failed: " + watch_->diagnose(detail::brief(e)));
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  DistOptions options_;
  std::unique_ptr<detail::Watch> watch_;
  bool cuda_ = false;
  std::atomic<bool> failed_{false};
  std::atomic<int> same_seq_{0};
};

}  // namespace

std::shared_ptr<RankGroup> detail::over_watched(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                                c10::intrusive_ptr<c10d::Store> store, int rank,
                                                int world_size, const DistOptions& options,
                                                std::unique_ptr<Watch> watch) {
  check_group(pg, store, rank, world_size);
  return std::make_shared<C10dRanks>(std::move(pg), std::move(store), rank, world_size, options,
                                     std::move(watch));
}

std::shared_ptr<RankGroup> over(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                const DistOptions& options) {
  check_group(pg, store, rank, world_size);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout();
  auto watch = std::make_unique<detail::Watch>(store, rank, world_size, options);
  watch->join(deadline);
  return detail::over_watched(std::move(pg), std::move(store), rank, world_size, options,
                              std::move(watch));
}

}  // namespace ampactor::dist
