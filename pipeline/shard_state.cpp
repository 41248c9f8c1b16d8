// The sharded optimizer state (AsyncOptimizerOptions::shard_optimizer_state): each rank keeps
// the masters of one shard, reduce-scatters the gradients so that it holds the ranks' mean of that
// shard, steps it and all-gathers the weights (internal/placement.h's shard placement drives it).
#include "internal/shard_state.h"
#include <ampactor/core/errors.h>
#include <ampactor/scaler/clip.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
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

ShardedState::ShardedState(std::vector<at::Tensor>& model, std::shared_ptr<RankGroup> ranks,
                           at::ScalarType optim_dtype, bool spare, bool pinned)
    : ranks_(std::move(ranks)), layout_(numels_of(model), ranks_->size()) {
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < model.size(); ++i)
    if (!model[i].is_contiguous() || !model[i].device().is_cpu() ||
        model[i].scalar_type() != model[0].scalar_type())
      throw ScalerError(errc::bad_parameters,
                        "AsyncOptimizer: shard_optimizer_state needs contiguous parameters of one "
                        "dtype on the CPU; model parameter " +
                            std::to_string(i) + " is not");
  const at::TensorOptions o =
      model.empty() ? at::TensorOptions(at::kFloat) : model[0].options().requires_grad(false);
  flat_ = at::empty({layout_.world() * layout_.slot()}, o.pinned_memory(pinned)).zero_();
  attach_weights(model);
  if (spare) spare_ = flat_.clone();
  for (const at::Tensor& p : model)
    holders_.push_back(at::zeros({}, p.options().dtype(at::kFloat)).expand(p.sizes()));
  grads_ = at::zeros({layout_.world() * layout_.slot()}, at::kFloat);
  prepare_grads();
  mine_ = layout_.pieces(ranks_->rank());
  for (const ShardPiece& s : mine_)
    masters_.push_back(weights_of(flat_, s)
                           .to(optim_dtype, /*non_blocking=*/false, /*copy=*/true)
                           .set_requires_grad(true));
}

at::Tensor ShardedState::grad_piece(std::size_t j) const {
  const at::Tensor& g = holders_[mine_[j].param].grad();
  return g.defined() ? g.reshape({-1}).narrow(0, mine_[j].offset, mine_[j].length) : at::Tensor();
}

at::Tensor ShardedState::grad_view(std::size_t i) const {
  // Its own version counter, not grads_'s: a view's would count every bucket's reduce-scatter
  // into grads_, and a speculative step that read it would never be taken.
  const at::Tensor& h = holders_[i];
  return at::empty({0}, grads_.options())
      .set_(grads_.storage(), layout_.start(i), {h.numel()}, {1})
      .view(h.sizes());
}

void ShardedState::prepare_grads() {
  for (std::size_t i = 0; i < holders_.size(); ++i) {
    at::Tensor h = holders_[i];
    const float* at = grads_.data_ptr<float>() + layout_.start(i);
    if (!h.grad().defined() || h.grad().data_ptr() != at) h.mutable_grad() = grad_view(i);
  }
}

void ShardedState::regather_grad(std::size_t i) {
  at::Tensor h = holders_[i];
  const at::Tensor g = h.grad(), view = grad_view(i);
  if (!g.defined() || g.data_ptr() == view.data_ptr()) return;
  view.copy_(g);
  h.mutable_grad() = view;
}

GradReduce ShardedState::reducer() {
  return [this](std::vector<at::Tensor>&, float* max_values, int n) {
    std::vector<std::size_t> all(holders_.size());
    for (std::size_t i = 0; i < all.size(); ++i)
      all[i] = i;
    reduce(std::move(all), max_values, n);
  };
}

void ShardedState::reduce(std::vector<std::size_t> params, float* max_values, int n) {
  at::NoGradGuard no_grad;
  std::sort(params.begin(), params.end());
  // The runs of consecutive parameters: each one range of grads_.
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  for (std::size_t i : params) {
    regather_grad(i);
    const std::int64_t lo = layout_.start(i), hi = lo + holders_[i].numel();
    if (!runs.empty() && runs.back().second == lo)
      runs.back().second = hi;
    else
      runs.emplace_back(lo, hi);
  }
  if (runs.empty()) runs.emplace_back(0, 0);  // the values are agreed all the same
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const auto [lo, hi] = runs[k];
    std::vector<std::int64_t> bounds;
    for (int r = 0; r < layout_.world(); ++r)
      bounds.push_back(std::clamp(layout_.begin(r), lo, hi) - lo);
    bounds.push_back(hi - lo);
    at::Tensor part = grads_.narrow(0, lo, hi - lo);
    ranks_->reduce_scatter(part, bounds, k == 0 ? max_values : nullptr, k == 0 ? n : 0);
  }
}

void ShardedState::attach_grads() {
  for (std::size_t j = 0; j < mine_.size(); ++j) {
    at::Tensor m = masters_[j];
    m.mutable_grad() = grad_piece(j);
  }
}

double ShardedState::clip(double max_norm) {
  // Each rank's pieces' squares, in a slot of the largest piece count per rank, NaN for none.
  const std::int64_t w = layout_.world();
  std::vector<std::vector<ShardPiece>> pieces;
  std::size_t most = 0;
  for (int r = 0; r < w; ++r)
    most = std::max(most, pieces.emplace_back(layout_.pieces(r)).size());
  const std::int64_t p = std::int64_t(most);
  at::Tensor all = at::full({w * p}, std::numeric_limits<double>::quiet_NaN(), at::kDouble);
  double* v = all.data_ptr<double>();
  for (std::size_t j = 0; j < mine_.size(); ++j)
    if (const at::Tensor g = grad_piece(j); g.defined())
      v[rank() * p + std::int64_t(j)] = squared_norm(g);
  if (w > 1 && p > 0) {
    at::Tensor bytes = all.view(at::kByte);
    ranks_->all_gather(all.narrow(0, rank() * p, p).view(at::kByte), bytes);
  }
  // Each parameter's square: its pieces' summed in flat (rank) order, as piece_square sums them.
  std::vector<double> per(holders_.size(), std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t r = 0; r < w; ++r)
    for (std::size_t j = 0; j < pieces[std::size_t(r)].size(); ++j) {
      const double s = v[r * p + std::int64_t(j)];
      double& into = per[pieces[std::size_t(r)][j].param];
      if (!std::isnan(s)) into = std::isnan(into) ? s : into + s;
    }
  std::vector<double> squares;
  for (double s : per)
    if (!std::isnan(s)) squares.push_back(s);
  const double norm = norm_of_squares(squares);
  const double c = clip_coefficient(norm, max_norm);
  at::NoGradGuard no_grad;
  if (c < 1)
    for (const at::Tensor& m : masters_)
      if (m.grad().defined()) m.grad().mul_(double(float(c)));  // torch's fp32 coefficient
  return norm;
}

at::Tensor ShardedState::weights_of(const at::Tensor& flat, const ShardPiece& s) const {
  return flat.narrow(0, layout_.start(s.param) + s.offset, s.length);
}

at::Tensor ShardedState::param_in(const at::Tensor& flat, const at::Tensor& p,
                                  std::size_t i) const {
  return flat.narrow(0, layout_.start(i), p.numel()).view(p.sizes());
}

bool ShardedState::attach_weights(std::vector<at::Tensor>& model) {
  at::AutoGradMode no_grad(false);
  bool any = false;
  for (std::size_t i = 0; i < model.size(); ++i) {
    at::Tensor w = param_in(flat_, model[i], i);
    if (model[i].data_ptr() == w.data_ptr()) continue;
    w.copy_(model[i].detach());
    model[i].set_data(w);  // the parameter stays the model's; its weights now live in flat_
    any = true;
  }
  return any;
}

void ShardedState::gather(std::vector<at::Tensor>& model, bool written) {
  // A parameter made a view again holds its own weights in this rank's slot too: the masters'.
  const bool reattached = attach_weights(model);
  gather_into(flat_, written && !reattached);
}

void ShardedState::gather_spare(bool written) {
  gather_into(spare_, written);
}

std::vector<at::Tensor> ShardedState::step_weights(bool spare) const {
  std::vector<at::Tensor> w;
  for (const ShardPiece& s : mine_)
    w.push_back(weights_of(spare ? spare_ : flat_, s));
  return w;
}

void ShardedState::gather_into(at::Tensor& flat, bool written) {
  at::AutoGradMode no_grad(false);
  if (!written)
    for (std::size_t j = 0; j < mine_.size(); ++j)
      weights_of(flat, mine_[j]).copy_(masters_[j]);
  all_gather(flat);
}

void ShardedState::exchange_spare() {
  all_gather(spare_);
}

void ShardedState::all_gather(at::Tensor& flat) {
  if (layout_.world() == 1) return;
  const at::Tensor bytes = flat.view(at::kByte);
  const std::int64_t slot = layout_.slot() * std::int64_t(flat.element_size());
  at::Tensor all = bytes;
  ranks_->all_gather(bytes.narrow(0, ranks_->rank() * slot, slot), all);
}

void ShardedState::swap(std::vector<at::Tensor>& model) {
  std::swap(flat_, spare_);
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < model.size(); ++i)
    model[i].set_data(param_in(flat_, model[i], i));
}

}  // namespace ampactor::internal
