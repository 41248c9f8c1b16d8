// The asynchronous optimizer pipeline (RoundPipe's design, made safe for fp16): the optimizer
// works on fp32 master copies of the model's parameters on the optimizer thread, while the main
// thread runs the next forward/backward on the model's own (e.g. fp16) weights.
//
// step(opt, fn) for iteration k queues, in order: (a) masters -> model weights (cast to the
// model's dtype), (b) the fused grad move: model grads -> master grads, unscaled with iteration
// k's scale and checked for inf/NaN in one pass, which reports UnscaleDone at once, then (c) fn,
// the optimizer math. It waits for (a) and (b) only. With staleness 1 (default) iteration k+1
// therefore runs on the weights of step k-1 and fn overlaps its forward/backward; with staleness 0
// it waits for fn as well and copies the result back: plain synchronous training. swap_weights
// moves (a) out of the wait: fn's job fills a spare copy of the weights and (a) swaps it in.
// defer_grad_move moves (b) out of it: step() takes the grads and (b) runs in fn's job.
// With a fused optimizer (ampactor::optim) (b) only reads the grads for inf/NaN and the step
// reads them again, unscaling inside, and writes the weights (the model at staleness 0, the
// spare with swap_weights) in the same pass; at staleness 1 step() then takes the grads.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <ampactor/core/arg.h>
#include <ampactor/core/pipeline_tap.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ampactor {

class GradScaler;
namespace internal {
struct Pipeline;
struct RunAccess;
}  // namespace internal

/// Named options: AsyncOptimizerOptions().optimizer_threads(1).swap_weights(true). A setter
/// refuses a bad value with ScalerError(errc::bad_option) and changes nothing; the combinations
/// (swap_weights or defer_grad_move with staleness 0) are refused by AsyncOptimizer's constructor.
/// Where a sharded run's save keeps a second copy of each rank's shard
/// (AsyncOptimizerOptions::shard_replicas).
enum class ShardReplicas {
  automatic,  // on a buddy where the ranks run on more than one host, else none
  off,        // none
  buddy,      // on a buddy, on one host too (the next rank)
};

class AsyncOptimizerOptions {
  /// 1: iteration k+1 runs on the weights of step k-1 (the optimizer overlaps); 0: synchronous.
  AMPACTOR_ARG(int, staleness, 1);
  /// The masters' dtype (the optimizer's precision): at::kFloat or at::kDouble.
  AMPACTOR_ARG(at::ScalarType, optim_dtype, at::kFloat);
  /// LibTorch intra-op threads for the optimizer thread's own work (0: LibTorch's default), >= 0.
  /// Its OpenMP team is separate from the trainer's, so by default each side starts one thread
  /// per core and, overlapped, they fight for the cores: 1 is usually right when the trainer
  /// uses the other cores.
  AMPACTOR_ARG(int, optimizer_threads, 0);
  /// Staleness 1 only: keep a second copy of the model's weights. fn's job then writes step k's
  /// weights into it right after fn, overlapped with the trainer, and step k+1 swaps it in
  /// instead of copying, which leaves only the grad move for the trainer to wait for. Costs one
  /// more model-sized buffer. The parameters' storage alternates between the two buffers: views
  /// or data pointers of a parameter kept across steps go stale (the parameter tensors
  /// themselves, e.g. model->parameters(), stay valid).
  AMPACTOR_ARG_ANY(bool, swap_weights, false);
  /// Staleness 1 only: step() takes the model's gradients away (each parameter's grad() is
  /// undefined when it returns, so the next backward allocates fresh ones, as after
  /// zero_grad(set_to_none)) and the grad move runs in fn's job, overlapped with the next
  /// forward. The trainer then waits only for (a), and under the exact policy for the move's inf
  /// check in the next scale(); with swap_weights as well, step() waits only for the previous
  /// step's job, if it is still running, and swaps the buffers on the trainer's thread.
  AMPACTOR_ARG_ANY(bool, defer_grad_move, false);
  /// Where the masters, their grads and the optimizer's state live (default: the model's
  /// device). at::kCPU for a model on a GPU is RoundPipe's setting: the grads go to pinned host
  /// memory and the weights come back from it on two CUDA streams of their own, ordered by
  /// events (never a host-wide sync); the inf check is part of the CPU's fp16 -> fp32 grad move,
  /// and both copies overlap. The grad move then always runs in fn's job (as defer_grad_move)
  /// and the weights travel as swap_weights' would, so neither of those two applies. Staleness
  /// 1: step() waits for the previous step's job, then queues the copies and returns.
  AMPACTOR_ARG_ANY(std::optional<at::Device>, master_device, std::nullopt);
  /// Staleness 0 only: step each bucket of parameters as soon as backward has finished its
  /// gradients, on the optimizer thread, while backward goes on with the earlier layers. Each
  /// bucket is checked for inf/NaN and stepped speculatively into a second buffer (the live
  /// masters, moments and weights are only read); step() commits by swapping buffers, or drops
  /// everything if any gradient overflowed: the same masters, moments, step counts, weights,
  /// scales and skips as without overlap, bit for bit. Needs a fused optimizer
  /// (ampactor::optim) and the masters on the CPU. With the model on a GPU (master_device
  /// kCPU) each bucket's grads leave the GPU on the copy-out stream as soon as it is ready, and
  /// step() sends the committed weights back. With ranks (the model on the CPU) each bucket is
  /// averaged across them as soon as it is ready (in bucket order on every rank).
  /// Memory: the second buffer holds a copy of the masters and the optimizer state (Adam: 12
  /// bytes a parameter, SGD with momentum: 8) and of the weights, where the model is
  /// (overlap_bytes()).
  AMPACTOR_ARG_ANY(bool, overlap_backward, false);
  /// overlap_backward: the buckets, as indices into the model's parameters, each parameter in
  /// exactly one, in the order backward finishes them. Empty (default): the parameters in
  /// reverse order (backward's order for a model whose parameters are registered in the
  /// forward's order), packed into buckets of about bucket_bytes of masters.
  AMPACTOR_ARG_ANY(std::vector<std::vector<std::size_t>>, buckets, {});
  /// overlap_backward: the default buckets' size in bytes of masters (a parameter is never
  /// split), > 0. Smaller buckets start sooner and cost a job each (tens of microseconds).
  AMPACTOR_ARG(std::int64_t, bucket_bytes, std::int64_t(1) << 20);
  /// overlap_backward: a bucket becomes ready by itself when backward has accumulated every one
  /// of its gradients (hooks on the parameters' gradient accumulators, as DDP's Reducer); false:
  /// only when the trainer calls grads_ready(bucket).
  AMPACTOR_ARG_ANY(bool, ready_by_hooks, true);
  /// Clips the gradients before every step by their global 2-norm, as
  /// torch::nn::utils::clip_grad_norm_(params, max_norm) after unscale_ would: finite and > 0;
  /// nullopt (the default): no clipping. The total is that of the true-sized gradients, each
  /// tensor's norm taken in fp32 and their squares summed in double in parameter order; a step
  /// skipped for inf/NaN clips nothing. A fused optimizer (ampactor::optim) clips only this way:
  /// its step reads the model's gradients, so the masters' grads fn could clip are empty. With
  /// overlap_backward each bucket is measured as it becomes ready; when the total exceeds
  /// max_norm, step() steps every parameter again from the intact live state with the
  /// coefficient (bit for bit the clipped step without overlap).
  AMPACTOR_ARG(std::optional<double>, clip_grad_norm, std::nullopt);
  /// Data parallel (GradScalerOptions::ranks) only: each rank keeps the masters, and so the
  /// optimizer's state, of one contiguous shard of the parameters (ShardLayout: the parameters'
  /// elements in order, cut into world-size nearly equal ranges; optim_parameters() are this
  /// rank's pieces, 1-D). The gradients are averaged as without it (the same floats), each rank
  /// steps its shard, and an all-gather brings the updated weights into every rank's model:
  /// masters, moments, scales and skips bit for bit those of the unsharded run, with 1/N of the
  /// masters and state per rank. Staleness 0 and 1 (with defer_grad_move, swap_weights or both:
  /// with swap_weights the job gathers into a second flat buffer and the next step swaps it in),
  /// and with overlap_backward (each bucket averaged as it becomes ready, this rank's pieces of
  /// it stepped speculatively into a second flat buffer, which step() all-gathers and swaps in).
  /// With the model on a GPU (master_device kCPU) the flat buffer is the pinned host weights,
  /// all-gathered in each step's job and copied to the model by the next exchange. Every rank
  /// must set it alike (checked at construction). save_run and load_run become collectives
  /// (<ampactor/checkpoint/sharded_checkpoint.h>).
  AMPACTOR_ARG_ANY(bool, shard_optimizer_state, false);
  /// With shard_optimizer_state: save_run also writes each rank's shard on its buddy, the rank
  /// `by` places on around the ring for the least `by` that puts every rank's buddy on another
  /// host (by host name: local_world_size where each host runs as many ranks), and the manifest
  /// on every host; so the survivors of one lost host hold every shard of the last save, and
  /// load_run on fewer ranks re-shards it. Costs a shard's exchange and write per rank
  /// (bench/distributed/README.md). automatic: where the ranks run on more than one host.
  AMPACTOR_ARG_ANY(ShardReplicas, shard_replicas, ShardReplicas::automatic);
  /// Told each iteration's timing: how long step() held the trainer, the step's time on the
  /// optimizer thread and clip_grad_norm's norm (e.g. ampactor::Metrics,
  /// <ampactor/metrics/metrics.h>, given to the keeper too). A tap that throws is dropped, with
  /// a line on stderr; the step goes on.
  AMPACTOR_ARG_ANY(std::shared_ptr<PipelineTap>, tap, nullptr);
};

class AsyncOptimizer {
 public:
  /// `model_params` are the model's parameters (model->parameters()); they stay the model's.
  /// An invalid combination of options throws ScalerError(errc::bad_option); invalid parameters
  /// throw ScalerError(errc::bad_parameters).
  AsyncOptimizer(std::vector<at::Tensor> model_params, GradScaler& scaler,
                 AsyncOptimizerOptions options = {});
  /// Waits for the steps in flight (errors are the scaler's to report), then destroys the
  /// optimizers it owns (make_optimizer). A scaler destroyed first has run them all already:
  /// neither order lets a step touch what is gone.
  ~AsyncOptimizer();
  AsyncOptimizer(const AsyncOptimizer&) = delete;
  AsyncOptimizer& operator=(const AsyncOptimizer&) = delete;

  /// The master copies, one per model parameter, in the same order: build the optimizer over
  /// these (e.g. torch::optim::AdamW(async.optim_parameters(), ...)).
  const std::vector<at::Tensor>& optim_parameters() const;

  /// An optimizer of type Opt over optim_parameters(), owned by the pipeline, so that no step in
  /// flight can outlive it whatever the order in which the scaler and the pipeline are declared:
  ///   auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(
  ///       torch::optim::AdamWOptions(1e-3));
  /// `args` follow the parameters in Opt's constructor. An optimizer declared by the caller must
  /// be declared before the pipeline (so that it goes after it).
  template <class Opt, class... Args>
  Opt& make_optimizer(Args&&... args) {
    auto opt = std::make_shared<Opt>(optim_parameters(), std::forward<Args>(args)...);
    Opt& made = *opt;
    adopt(std::move(opt));
    return made;
  }

  /// Iteration k's step for `opt`, an optimizer over optim_parameters() (one with any other
  /// parameter, e.g. the model's, is refused: ScalerError(errc::bad_parameters), nothing queued).
  /// fn runs on the optimizer thread and normally calls scaler.step(opt) (it may not unscale: the
  /// grad move did). The model's grads may be zeroed as soon as this returns (with defer_grad_move
  /// they are already gone).
  void step(torch::optim::Optimizer& opt, std::function<void()> fn);
  /// Waits for every queued step and brings the model's weights up to date with the masters.
  void sync();

  int staleness() const;
  /// clip_grad_norm: the total norm the last finished step measured (what torch's
  /// clip_grad_norm_ returns), before clipping; NaN before the first, for a step skipped for
  /// inf/NaN, and without the option. At staleness 0 that is the step step() just waited for.
  double grad_norm() const;

  // ---- overlap_backward (ScalerError(errc::bad_option) without it) ----
  /// The buckets, as indices into the model's parameters.
  const std::vector<std::vector<std::size_t>>& buckets() const;
  /// The trainer's word that bucket b's gradients are final in this iteration (a trainer that
  /// runs its backward layer by layer; with ready_by_hooks the hooks say it by themselves).
  /// Twice in one iteration: ScalerError(errc::protocol_misuse), and that iteration's step is
  /// refused. Main thread.
  void grads_ready(std::size_t bucket);
  /// Gradient accumulation: while on, backward only accumulates (no bucket becomes ready by its
  /// hooks). Turn it on before the first micro-batch's backward and off before the last one's.
  void accumulate(bool on);
  /// Bytes of the second buffers held now (the speculated masters and state, the spare
  /// weights); 0 without overlap_backward.
  std::int64_t overlap_bytes() const;

  /// Names the parameters in the scaler's overflow reports (GradScaler::last_overflow(),
  /// wait_result(k).overflow): model->named_parameters() of the model this pipeline was built
  /// on; each name goes to its parameter's master, which the optimizer holds. A name whose
  /// tensor is none of the model's parameters is refused (bad_parameters), nothing named.
  AsyncOptimizer& name_parameters(const torch::OrderedDict<std::string, at::Tensor>& named);

  /// Waits for the steps in flight (a job's error is thrown here, as by the scaler's sync()),
  /// then writes the masters, the spare weights (swap_weights) and whether the model's weights
  /// are one step behind the masters (staleness 1). The model's weights stay as they are, so a
  /// checkpoint changes nothing in the run; save the model, the optimizer and the scaler beside
  /// it, after this call (the optimizer then holds still until the next step()).
  void save(torch::serialize::OutputArchive& archive) const;
  /// What save() wrote: the masters (and spare weights) are replaced, so the next step()
  /// continues the saved run, given the model, optimizer and scaler saved beside it. Another
  /// number of parameters, a shape or the masters' dtype: ScalerError(errc::bad_checkpoint),
  /// nothing changed. The spare weights or staleness may differ from the saved pipeline's (a
  /// staleness-0 pipeline brings the model's weights up to date at once).
  void load(torch::serialize::InputArchive& archive);

 private:
  friend struct internal::RunAccess;  // save_run and load_run
  void adopt(std::shared_ptr<torch::optim::Optimizer> opt);
  std::unique_ptr<internal::Pipeline> p_;  // the placement, the schedule and their state
};

}  // namespace ampactor
