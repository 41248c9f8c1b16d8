// AsyncOptimizerOptions::shard_optimizer_state: the masters (and so the optimizer's state) of one
// contiguous shard of the parameters per rank (ShardLayout), the full-size fp32 gradients the
// ranks reduce-scatter (each rank receives its shard's), and the all-gather that brings every
// rank's updated shard into every model.
#pragma once

#include <ampactor/core/shard_layout.h>
#include <ampactor/scaler/ranks.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ampactor::internal {

class ShardedState {
 public:
  /// model: the model's parameters (contiguous, on the CPU, one dtype; ScalerError(bad_parameters)
  /// otherwise). They become views of one flat buffer in the layout's order, which the weights'
  /// all-gather fills in place.
  /// spare (swap_weights, overlap_backward): a second flat buffer, which gather_spare() fills and
  /// swap() makes the model's.
  /// pinned: the flat buffer in pinned memory (the model on a GPU: `model` are then the pinned
  /// host weights the offload copies to it).
  ShardedState(std::vector<at::Tensor>& model, std::shared_ptr<RankGroup> ranks,
               at::ScalarType optim_dtype, bool spare, bool pinned = false);

  const ShardLayout& layout() const { return layout_; }
  int rank() const { return ranks_->rank(); }
  RankGroup& ranks() const { return *ranks_; }
  /// This rank's masters, one 1-D tensor per piece of its shard (the optimizer's parameters).
  const std::vector<at::Tensor>& masters() const { return masters_; }
  /// Which piece of which parameter each master is.
  const std::vector<ShardPiece>& pieces() const { return mine_; }
  /// One per model parameter, in its shape: the grad move writes the fp32 gradient into their
  /// grad() (they hold no data of their own: a broadcast scalar), views of one flat buffer in
  /// the layout's order (prepare_grads), which reduce() reduce-scatters: only this rank's shard
  /// of it holds the ranks' mean after.
  const std::vector<at::Tensor>& holders() const { return holders_; }
  /// Before a move: every holder's grad() a view of the flat gradient buffer, which the move
  /// writes in place.
  void prepare_grads();
  /// The grad move's reduce (GradReduce): the flat gradient buffer reduce-scattered over the
  /// shards, the values agreed in the same round. A moved gradient that is not its view
  /// (adopted) is copied in first.
  GradReduce reducer();
  /// The same for the parameters `params` alone (an overlap_backward bucket): each run of
  /// consecutive parameters reduce-scattered over the shards, the values agreed with the first.
  void reduce(std::vector<std::size_t> params, float* max_values, int n);
  /// After the move: each master's grad() becomes a view of its piece of the mean gradient.
  void attach_grads();
  /// Piece j's view of its parameter's mean gradient (in the holder's grad()), as attach_grads
  /// makes it; undefined when the parameter has none.
  at::Tensor grad_piece(std::size_t j) const;
  /// Piece j's weights in the spare buffer (overlap_backward's steps write them there).
  at::Tensor spare_piece(std::size_t j) const { return weights_of(spare_, mine_[j]); }
  std::int64_t spare_bytes() const { return spare_.defined() ? std::int64_t(spare_.nbytes()) : 0; }
  /// clip_grad_norm_ over the ranks' mean gradient, applied to this rank's masters' grads:
  /// returns the total norm. Each rank measures its pieces (piece_square's squares), the ranks
  /// exchange them (a collective), and every rank sums them in parameter order: the norm the
  /// unsharded ranks measure over the same layout.
  double clip(double max_norm);
  /// This rank's masters into its slot of the weights, then every rank's slot into every rank's
  /// (one all-gather in place). A collective: every rank calls it in turn. A parameter whose
  /// storage was replaced meanwhile (Module::load sets a loaded tensor's) is first made a view
  /// of the flat buffer again, holding what it holds. written: the step wrote this rank's slot
  /// already (step_weights(false)), so only the all-gather is left.
  void gather(std::vector<at::Tensor>& model, bool written = false);
  /// swap_weights: this rank's masters into its slot of the spare buffer, then every rank's slot
  /// into every rank's spare (one all-gather, a collective). The model is not touched.
  /// written: the step wrote this rank's slot of the spare already (step_weights(true)).
  void gather_spare(bool written = false);
  /// This rank's pieces of the model's buffer (spare: of the spare), one per master, for a fused
  /// step to write the new weights in its own pass (no copy of the masters after it).
  std::vector<at::Tensor> step_weights(bool spare) const;
  /// overlap_backward: the step wrote this rank's pieces of the spare: every rank's slot into
  /// every rank's spare (the all-gather alone, a collective).
  void exchange_spare();
  /// swap_weights: the spare becomes the model's weights (each parameter a view of it, no copy),
  /// and the model's buffer the spare. Nothing may read the parameters meanwhile.
  void swap(std::vector<at::Tensor>& model);

 private:
  std::shared_ptr<RankGroup> ranks_;
  ShardLayout layout_;
  std::vector<ShardPiece> mine_;
  std::vector<at::Tensor> masters_, holders_;
  at::Tensor flat_;   // the model's weights: world x slot elements, each rank's shard in its slot
  at::Tensor grads_;  // the holders' fp32 gradients, laid out as flat_
  at::Tensor spare_;  // swap_weights: the next weights, laid out as flat_
  /// A piece's weights in `flat` (flat_ or spare_).
  at::Tensor weights_of(const at::Tensor& flat, const ShardPiece& s) const;
  /// Parameter i (p) as a view of `flat` (flat_ or spare_), in its shape.
  at::Tensor param_in(const at::Tensor& flat, const at::Tensor& p, std::size_t i) const;
  /// This rank's masters into its slot of `flat` (unless `written`), then the all-gather into
  /// every rank's.
  void gather_into(at::Tensor& flat, bool written);
  /// Every rank's slot of `flat` into every rank's (the all-gather in place).
  void all_gather(at::Tensor& flat);
  /// Holder i's gradient in grads_.
  at::Tensor grad_view(std::size_t i) const;
  /// Holder i's grad() made the view of grads_ again, holding what it holds (adopted).
  void regather_grad(std::size_t i);
  /// Makes each parameter that is not one a view of flat_, holding what it holds. Returns
  /// whether any was not.
  bool attach_weights(std::vector<at::Tensor>& model);
};

}  // namespace ampactor::internal
