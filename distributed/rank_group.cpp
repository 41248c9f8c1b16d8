// RankGroup over c10d: MAX all-reduces for found_inf, bucketed averages and reduce-scatters for
// gradients (summed in rank order, rank_sum.h), and the store for what a collective cannot say:
// which rank failed, and why.
#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include "rank_sum.h"
#include "watch.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace ampactor::dist {

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
  ~C10dRanks() override { watch_->leave(/*for_hung=*/true); }

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
    at::Tensor slots = detail::max_slots(max_values, n, rank_, size_, cuda_);
    std::vector<detail::Bucket> buckets = detail::bucket(tensors, options_.bucket_bytes());
    // The slots ride at the end of the first fp32 bucket on their device (else alone): no round
    // of their own (a separate collective, even in flight beside the buckets, costs about a
    // round trip more).
    detail::Bucket* carrier = nullptr;
    for (detail::Bucket& k : buckets)
      if (!carrier && slots.defined() && tensors[k.members[0]].scalar_type() == at::kFloat &&
          tensors[k.members[0]].device() == slots.device())
        carrier = &k;
    std::vector<at::Tensor> flats;
    for (detail::Bucket& k : buckets) {
      std::vector<at::Tensor> parts;
      for (std::size_t i : k.members)
        parts.push_back(tensors[i].reshape({-1}));
      if (&k == carrier) parts.push_back(slots.reshape({-1}));
      k.flat = at::cat(parts);
      flats.push_back(k.flat);
    }
    if (slots.defined() && !carrier) flats.push_back(slots);
    if (size_ == 2) {
      // Two ranks: every order of the sum is the one addition, so the backend's all-reduce
      // (which sends and receives at once) gives the rank-order floats, and faster.
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      o.timeout = options_.timeout();
      run("the gradient average", [&] {
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (const at::Tensor& f : flats) {
          std::vector<at::Tensor> list{f};
          works.push_back(pg_->allreduce(list, o));
        }
        for (auto& w : works)
          w->wait(options_.timeout());
      });
    } else {
      sum_in_rank_order(flats);
    }
    if (slots.defined())
      detail::read_maxima(carrier ? carrier->flat : slots, slots, max_values, n, size_);
    detail::unflatten_mean(buckets, tensors, size_);
  }

  void reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds, float* max_values,
                      int n) override {
    check_reduce_scatter(*this, part, bounds);
    refuse_after_failure();
    if (size_ == 1) return;
    // The maxima in a sum of their own, in flight beside the all-to-all: every rank needs them,
    // and a rank receives only its cut.
    at::Tensor slots = detail::max_slots(max_values, n, rank_, size_, part.is_cuda());
    // In chunks of at most bucket_bytes, two in flight: the buffers that receive the cuts stay
    // within two buckets however large the part.
    const std::int64_t step =
        std::max<std::int64_t>(1, options_.bucket_bytes() / std::int64_t(part.element_size()));
    std::vector<detail::RankOrderSum> sums;
    for (std::int64_t lo = 0; lo < part.numel(); lo += step) {
      const std::int64_t hi = std::min(part.numel(), lo + step);
      std::vector<std::int64_t> cuts;
      for (std::int64_t b : bounds)
        cuts.push_back(std::clamp(b, lo, hi) - lo);
      sums.emplace_back(part.narrow(0, lo, hi - lo), std::move(cuts), rank_, size_);
    }
    run("the gradient reduce-scatter", [&] {
      c10::intrusive_ptr<c10d::Work> slots_work;
      if (slots.defined()) {
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::SUM;
        o.timeout = options_.timeout();
        std::vector<at::Tensor> list{slots};
        slots_work = pg_->allreduce(list, o);
      }
      for (std::size_t k = 0; k < sums.size(); ++k) {
        sums[k].start(*pg_, options_.timeout());
        if (k > 0) sums[k - 1].finish(options_.timeout());
      }
      if (!sums.empty()) sums.back().finish(options_.timeout());
      if (slots_work) slots_work->wait(options_.timeout());
    });
    const std::size_t r = std::size_t(rank_);
    part.narrow(0, bounds[r], bounds[r + 1] - bounds[r]).div_(double(size_));
    if (slots.defined()) detail::read_maxima(slots, slots, max_values, n, size_);
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

  void shift(const at::Tensor& mine, int by, at::Tensor& theirs) override {
    // One piece, received into a buffer of its length and copied out (the saves use
    // shift_pieces: this copy is on no hot path).
    theirs = at::empty({0}, at::kByte);
    shift_pieces(mine, by, std::numeric_limits<std::int64_t>::max(),
                 [&](const char* data, std::size_t n) {
                   theirs = at::empty({std::int64_t(n)}, at::kByte);
                   std::memcpy(theirs.data_ptr(), data, n);
                 });
  }

  void shift_pieces(const at::Tensor& mine, int by, std::int64_t piece,
                    const std::function<void(const char*, std::size_t)>& take) override {
    refuse_after_failure();
    check_shift_pieces(*this, mine, by, piece);
    const int to = (rank_ + by) % size_, from = (rank_ - by + size_) % size_;
    at::Tensor len = at::empty({1}, at::kLong), their_len = at::empty({1}, at::kLong);
    len.fill_(mine.numel());
    std::exception_ptr taken;
    run("the shards' exchange", [&] {
      // Every piece sent at once; each received into one of two buffers while take has the
      // other, so the pieces arrive as the last one is written out.
      std::vector<c10::intrusive_ptr<c10d::Work>> sent;
      std::vector<std::vector<at::Tensor>> pieces{{len}};
      for (std::int64_t off = 0; off < mine.numel(); off += piece)
        pieces.push_back({mine.narrow(0, off, std::min(piece, mine.numel() - off))});
      for (std::size_t i = 0; i < pieces.size(); ++i)
        sent.push_back(pg_->send(pieces[i], to, i == 0 ? 1 : 2));
      std::vector<at::Tensor> in{their_len};
      pg_->recv(in, from, 1)->wait(options_.timeout());
      const std::int64_t n = their_len.item<std::int64_t>();
      // Two buffers where there are two pieces or more, else one.
      const at::Tensor buffers =
          at::empty({n > piece ? 2 : 1, std::max<std::int64_t>(1, std::min(piece, n))}, at::kByte);
      const auto post = [&](std::int64_t off) {
        std::vector<at::Tensor> into{
            buffers[(off / piece) % 2].narrow(0, 0, std::min(piece, n - off))};
        return pg_->recv(into, from, 2);
      };
      c10::intrusive_ptr<c10d::Work> next = n > 0 ? post(0) : c10::intrusive_ptr<c10d::Work>();
      for (std::int64_t off = 0; off < n; off += piece) {
        next->wait(options_.timeout());
        next = off + piece < n ? post(off + piece) : c10::intrusive_ptr<c10d::Work>();
        if (!taken) try {
            take(static_cast<const char*>(buffers[(off / piece) % 2].data_ptr()),
                 std::size_t(std::min(piece, n - off)));
          } catch (...) {
            taken = std::current_exception();
          }
      }
      for (auto& s : sent)
        s->wait(options_.timeout());
    });
    if (taken) std::rethrow_exception(taken);
  }

  void fail(const std::string& why) noexcept override {
    failed_ = true;
    report_failure("rank " + std::to_string(rank_) + " failed: " + why);
    try {
      store_->set(key("failed", rank_), bytes_of(why));
      // The first rank to fail is named by every survivor, even once the store is gone.
      if (store_->add(detail::kFirstFailureCount, 1) == 1) {
        store_->set(detail::kFirstFailure,
                    bytes_of("rank " + std::to_string(rank_) + " failed: " + why));
        // Until every other rank's heartbeat has read it (ten periods at most): a rank that
        // aborts on hearing of it takes the store (rank 0's) with it.
        const auto hb = options_.heartbeat();
        const auto end = std::chrono::steady_clock::now() + hb * 10;
        while (store_->add(detail::kFirstFailureSeen, 0) < size_ - 1 &&
               std::chrono::steady_clock::now() < end)
          std::this_thread::sleep_for(hb / 4);
      }
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

  /// Three ranks or more: each buffer reduce-scattered in even cuts (an all-to-all, the cuts
  /// summed in rank order), then the cuts' sums broadcast back; every phase of every buffer in
  /// flight at once.
  void sum_in_rank_order(const std::vector<at::Tensor>& flats) {
    std::vector<detail::RankOrderSum> sums;
    for (const at::Tensor& f : flats)
      sums.emplace_back(f, detail::even_bounds(f.numel(), size_), rank_, size_);
    run("the gradient average", [&] {
      for (auto& s : sums)
        s.start(*pg_, options_.timeout());
      for (auto& s : sums)
        s.finish(options_.timeout());
      for (auto& s : sums)
        s.start_gather(*pg_, options_.timeout());
      for (auto& s : sums)
        s.wait_gather(options_.timeout());
    });
  }

  /// all_gather on the CPU as one broadcast per rank, each into its part of `gathered` in place
  /// (broadcast_cuts).
  void gather_in_place(const at::Tensor& mine, at::Tensor& gathered) {
    const std::int64_t n = mine.numel();
    at::Tensor own = gathered.narrow(0, rank_ * n, n);
    if (own.data_ptr() != mine.data_ptr()) own.copy_(mine);
    std::vector<std::int64_t> bounds;
    for (int r = 0; r <= size_; ++r)
      bounds.push_back(r * n);
    run("the sharded weights' all-gather", [&] {
      for (auto& w : detail::broadcast_cuts(*pg_, gathered, bounds, options_.timeout()))
        w->wait(options_.timeout());
    });
  }

  template <class F>
  void run(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      const std::string why = "rank " + std::to_string(rank_) + ": " + what +
                              " failed: " + watch_->diagnose(detail::brief(e));
      report_failure(why);
      throw ScalerError(errc::rank_failed, why);
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
