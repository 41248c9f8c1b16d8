// The sharded optimizer state (AsyncOptimizerOptions::shard_optimizer_state): each rank keeps
// the masters of one shard, steps it from the ranks' mean gradient and all-gathers the weights.
#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/scaler/clip.h>
#include "internal/shard_state.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace ampactor::internal {

namespace {
std::vector<std::int64_t> numels_of(const std::vector<at::Tensor>& model) {
  std::vector<std::int64_t> n;
  for (const at::Tensor& p : model)
    n.push_back(p.numel());
  return n;
}
}  // namespace

ShardedState::ShardedState(const std::vector<at::Tensor>& model, std::shared_ptr<RankGroup> ranks,
                           at::ScalarType optim_dtype)
    : ranks_(std::move(ranks)), layout_(numels_of(model), ranks_->size()) {
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (!model[i].is_contiguous() || !model[i].device().is_cpu())
      throw ScalerError(errc::bad_parameters,
                        "AsyncOptimizer: shard_optimizer_state needs contiguous parameters on "
                        "the CPU; model parameter " +
                            std::to_string(i) + " is not");
    elem_bytes_.push_back(std::int64_t(model[i].element_size()));
    holders_.push_back(
        at::zeros({}, model[i].options().dtype(at::kFloat)).expand(model[i].sizes()));
  }
  for (int r = 0; r < layout_.world(); ++r) {
    std::int64_t bytes = 0;
    for (const ShardPiece& s : layout_.pieces(r))
      bytes += s.length * elem_bytes_[s.param];
    slot_bytes_ = std::max(slot_bytes_, bytes);
  }
  mine_ = layout_.pieces(ranks_->rank());
  for (const ShardPiece& s : mine_)
    masters_.push_back(model[s.param]
                           .detach()
                           .reshape({-1})
                           .narrow(0, s.offset, s.length)
                           .to(optim_dtype, /*non_blocking=*/false, /*copy=*/true)
                           .set_requires_grad(true));
}

void ShardedState::attach_grads() {
  for (std::size_t j = 0; j < mine_.size(); ++j) {
    const at::Tensor& g = holders_[mine_[j].param].grad();
    at::Tensor m = masters_[j];
    m.mutable_grad() =
        g.defined() ? g.reshape({-1}).narrow(0, mine_[j].offset, mine_[j].length) : at::Tensor();
  }
}

double ShardedState::grad_norm() const {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& h : holders_)
    grads.push_back(h.grad());
  return global_norm(grads, 1.0, nullptr);
}

void ShardedState::gather_into(std::vector<at::Tensor>& model) {
  at::AutoGradMode no_grad(false);
  // This rank's pieces, in the model's dtypes, packed as bytes into its slot.
  at::Tensor mine = at::zeros({slot_bytes_}, at::kByte);
  std::int64_t at_byte = 0;
  for (std::size_t j = 0; j < mine_.size(); ++j) {
    const ShardPiece& s = mine_[j];
    at::Tensor w = model[s.param].detach().reshape({-1}).narrow(0, s.offset, s.length);
    w.copy_(masters_[j]);
    const std::int64_t n = s.length * elem_bytes_[s.param];
    std::memcpy(mine.data_ptr<std::uint8_t>() + at_byte, w.data_ptr(), std::size_t(n));
    at_byte += n;
  }
  at::Tensor all = at::empty({slot_bytes_ * layout_.world()}, at::kByte);
  ranks_->all_gather(mine, all);
  for (int r = 0; r < layout_.world(); ++r) {
    if (r == ranks_->rank()) continue;
    const std::uint8_t* from = all.data_ptr<std::uint8_t>() + r * slot_bytes_;
    for (const ShardPiece& s : layout_.pieces(r)) {
      at::Tensor w = model[s.param].detach().reshape({-1}).narrow(0, s.offset, s.length);
      const std::int64_t n = s.length * elem_bytes_[s.param];
      std::memcpy(w.data_ptr(), from, std::size_t(n));
      from += n;
    }
  }
}

std::int64_t ShardedState::master_bytes() const {
  std::int64_t b = 0;
  for (const at::Tensor& m : masters_)
    b += m.numel() * std::int64_t(m.element_size());
  return b;
}

}  // namespace ampactor::internal

namespace ampactor {

void AsyncOptimizer::step_sharded(torch::optim::Optimizer& opt, std::function<void()> fn) {
  std::vector<at::Tensor> grads = model_grads();
  // On the optimizer thread: the ranks' mean gradient, whole, into the holders (the same floats
  // as the unsharded move), this rank's pieces of it into its masters' grads.
  auto move = [this, &opt, &grads] {
    std::vector<at::Tensor> holders = shard_->holders();
    JobContext::current()->move_and_unscale_(opt, grads, holders);
    shard_->attach_grads();
  };
  // clip_grad_norm_ over the whole mean gradient (every rank has it), applied to this shard.
  auto stepping = [this, &opt, max = options_.clip_grad_norm(), fn = std::move(fn)] {
    if (max) {
      double norm = std::numeric_limits<double>::quiet_NaN();  // skipped: nothing clipped
      if (!JobContext::current()->found_inf(opt).value_or(true)) {
        norm = shard_->grad_norm();
        const double c = clip_coefficient(norm, *max);
        at::NoGradGuard no_grad;
        if (c < 1)
          for (const at::Tensor& m : masters_)
            if (m.grad().defined()) m.grad().mul_(double(float(c)));  // torch's fp32 coefficient
      }
      grad_norm_ = norm;
    }
    if (fn) fn();
  };
  if (options_.staleness() == 0) {
    scaler().run_on_optimizer([&] {
      move();
      stepping();
      copy_to_model();
    });
    return;
  }
  // Staleness 1: the last step's shards into every model, then the move, waited for (both
  // collectives, in the same order on every rank); the step overlaps the next backward.
  scaler().run_on_optimizer([&] {
    copy_to_model();
    move();
  });
  scaler().submit(std::move(stepping), SubmitOptions().unscales(UnscalePermit::none()));
}

}  // namespace ampactor
