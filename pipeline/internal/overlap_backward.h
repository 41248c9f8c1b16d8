// AsyncOptimizer's overlapped-backward mode (AsyncOptimizerOptions::overlap_backward): each
// bucket of parameters is checked and stepped speculatively on the optimizer thread as soon as
// backward has finished its gradients; the last job (step()) commits or drops the speculation.
// With the model on a GPU and the masters on the CPU, backward runs on the GPU's autograd thread:
// the hooks then send each bucket's grads to the host and queue its job from there, while the
// trainer waits in backward(). Not installed.
#pragma once

#include <ampactor/scaler/step_tracker.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampactor {
class AsyncOptimizerOptions;
class GradScaler;
class RankGroup;
class JobContext;
struct GradSize;
namespace optim {
class FusedStep;
}
}  // namespace ampactor

namespace ampactor::internal {

class OverlapBackward;
class HostOffload;
class ShardedState;

/// overlap_backward's buckets: the options' own, checked (every parameter in exactly one, none
/// empty; else ScalerError(errc::bad_option)), or the parameters in reverse order packed into
/// about bucket_bytes of masters each.
std::vector<std::vector<std::size_t>> buckets_for(const AsyncOptimizerOptions& o,
                                                  const std::vector<at::Tensor>& model);
/// Why overlap_backward cannot run with these options, or "" when it can.
std::string overlap_refusal(const AsyncOptimizerOptions& o, const GradScaler& scaler,
                            const std::vector<at::Tensor>& model);

/// What the parameters' gradient-accumulator hooks reach; cleared when the pipeline goes, so a
/// hook that outlives it does nothing.
struct OverlapHub {
  std::atomic<OverlapBackward*> overlap{nullptr};
};

class OverlapBackward {
 public:
  /// `buckets`: the parameters' indices, each once (checked by the caller). hooks: install the
  /// post-accumulation hooks (else only grads_ready() makes a bucket ready). clip: clipping's
  /// max_norm (AsyncOptimizerOptions::clip_grad_norm): each bucket is measured too. offload:
  /// the model on a GPU, the masters on the CPU (the pipeline's, outliving this): each ready
  /// bucket's grads leave the GPU at once, and the steps write the pinned host weights.
  /// shard: the sharded optimizer state (the pipeline's, outliving this; with ranks): each
  /// bucket's mean goes to the shard's holders, the steps of this rank's pieces write its spare
  /// buffer, and the commit all-gathers it and swaps it in.
  OverlapBackward(GradScaler& scaler, const std::vector<at::Tensor>& model,
                  std::vector<std::vector<std::size_t>> buckets, bool hooks,
                  std::optional<double> clip, HostOffload* offload = nullptr,
                  ShardedState* shard = nullptr);
  ~OverlapBackward();
  OverlapBackward(const OverlapBackward&) = delete;
  OverlapBackward& operator=(const OverlapBackward&) = delete;

  const std::vector<std::vector<std::size_t>>& buckets() const { return buckets_; }
  /// The optimizer the buckets are stepped with: the first fused one the pipeline makes or is
  /// stepped with, holding every master in order; another one later is refused.
  void use(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& masters);
  /// Whether opt's parameters, in param-group order, are exactly `masters`.
  static bool holds_in_order(const torch::optim::Optimizer& opt,
                             const std::vector<at::Tensor>& masters);
  torch::optim::Optimizer* optimizer() const { return opt_; }
  /// `f` is given to each optimizer use() takes (FusedStep::on_release): the pipeline's way to
  /// run the jobs queued with it before it goes.
  void set_release(std::function<void()> f) { release_ = std::move(f); }
  /// The optimizer went (its release): the buckets step with none until step() names one.
  void forget_optimizer();
  /// The pipeline goes first: its optimizer no longer calls it.
  void unlink();

  // ---- main thread ----
  /// Backward finished parameter i's gradient (its accumulator's hook).
  void grad_final(std::size_t i);
  /// The trainer says bucket b's gradients are final.
  void grads_ready(std::size_t b);
  void accumulate(bool on) { accumulating_ = on; }
  /// A gradient was final twice in this iteration: its step is refused.
  bool poisoned() const { return poisoned_; }
  bool accumulating() const { return accumulating_; }
  /// offload: the parameters whose grads a bucket sent to the host in this iteration.
  const std::vector<bool>& sent() const { return sent_; }
  /// The iteration's last job, run on the optimizer thread by step(): checks what no bucket job
  /// checked, records the whole check with the scaler, clips (a clipped step takes no
  /// speculation: its inverse scale differs), runs fn (which steps), drops whatever speculation
  /// was not taken, and puts the new weights in the model (a buffer swap). Returns clipping's
  /// total norm (NaN without it or when skipped).
  double finish(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads,
                const std::function<void()>& fn);
  /// The main thread's side of a new iteration (after step(), whether it succeeded or not).
  void reset_iteration();
  /// Bytes of the second buffers: the speculated masters and state, and the spare weights.
  std::int64_t extra_bytes() const;

 private:
  /// Bucket b's gradients are final: its job is queued (with ranks, in bucket order).
  void became_ready(std::size_t b);
  void submit(std::size_t b);
  /// Ranks, on the optimizer thread: bucket b's gradients moved into the masters' grads,
  /// unscaled and checked, then averaged across the ranks with found_inf and the size agreed in
  /// the same collective (every rank averages every bucket, in bucket order).
  void move_and_average(std::size_t b, const std::vector<at::Tensor>& grads, JobContext& job);
  /// Speculates bucket b's step from `grads` (parameter i's at i), at inverse scale `inv`.
  void speculate(std::size_t b, const std::vector<at::Tensor>& grads, float inv);
  /// finish's record with ranks: averages the buckets no job did, in order, records the
  /// agreed check and clips. Returns clipping's total norm.
  double finish_ranks(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& grads,
                      JobContext& job);
  /// Drops the speculation not taken and swaps the new weights in. Returns norm.
  double commit(torch::optim::Optimizer& opt, JobContext& job, double norm);
  /// On the optimizer thread: check bucket b's gradients and, unless an overflow is already
  /// known, step them speculatively.
  void run_bucket(std::size_t b, const std::vector<at::Tensor>& grads);
  void begin_iteration_on_optimizer(std::int64_t k);
  void swap_weights();
  /// Where a step writes the new 16-bit weights: the spare buffer, the pinned host weights, or
  /// (sharded) this rank's pieces of the shard's spare.
  std::vector<at::Tensor> weights_out();
  /// Where parameter i's fp32 mean gradient goes: its master's grad(), or (sharded) its holder's.
  const at::Tensor& grad_dest(std::size_t i) const;
  /// Speculates this rank's pieces of bucket b's parameters (sharded), from the mean gradient.
  void speculate_shard(std::size_t b);
  /// offload: the masters' storage before fn, to tell which speculative steps it took.
  void note_masters();

  GradScaler& scaler_;
  std::vector<at::Tensor> model_;
  std::vector<at::Tensor> spare_;   // the weights' second buffer: speculative steps write here
  HostOffload* offload_ = nullptr;  // the model on a GPU: the pinned host weights instead
  ShardedState* shard_ = nullptr;   // shard_optimizer_state: masters_ are this rank's pieces
  std::vector<std::vector<std::size_t>> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::shared_ptr<RankGroup> ranks_;
  std::vector<at::Tensor> masters_;  // opt_'s parameters, in order (one per parameter unsharded)
  torch::optim::Optimizer* opt_ = nullptr;
  optim::FusedStep* fused_ = nullptr;
  std::function<void()> release_;
  std::shared_ptr<OverlapHub> hub_;
  struct Accumulators;  // the parameters' gradient accumulators, kept alive as DDP's Reducer does
  std::unique_ptr<Accumulators> accumulators_;
  std::thread::id main_;
  // Main thread.
  bool accumulating_ = false;
  std::vector<bool> final_;        // parameter i's gradient is final in this iteration
  std::vector<std::size_t> left_;  // parameters of bucket b not final yet
  std::vector<bool> ready_;        // bucket b's gradients are final
  std::size_t next_ = 0;           // ranks: the first bucket not queued yet
  bool poisoned_ = false;
  std::vector<bool> sent_;                // offload: parameter i's grad is on its way to the host
  std::vector<const void*> master_ptrs_;  // offload: note_masters()
  // Optimizer thread, for iteration k_.
  std::int64_t k_ = -1;
  bool found_ = false;
  std::vector<bool> checked_;  // parameter i's gradient was checked by a bucket job
  AbsmaxList absmax_;
  std::optional<double> clip_;
  std::vector<double> squares_;  // clip: parameter i's squared_norm, NaN where not measured
  // Ranks, for iteration k_.
  std::vector<bool> averaged_;          // bucket b was moved and averaged
  bool local_found_ = false;            // this rank's own found_inf
  std::vector<std::int32_t> found_by_;  // the ranks whose own check found inf or NaN
  double agreed_max_ = 0, dtype_max_ = 0;
};

}  // namespace ampactor::internal
