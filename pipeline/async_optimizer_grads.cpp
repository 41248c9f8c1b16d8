// What AsyncOptimizer::step does besides moving the gradients: clipping by the global 2-norm
// inside the step's job (AsyncOptimizerOptions::clip_grad_norm), the warning when the model's
// gradients were never cleared, and the ranks told of a waited step job's error.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/ranks.h>
#include <torch/optim/optimizer.h>
#include "internal/shard_state.h"

#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

namespace ampactor {

AsyncOptimizerOptions& AsyncOptimizerOptions::clip_grad_norm(std::optional<double> v) {
  if (v && !(std::isfinite(*v) && *v > 0)) {
    std::ostringstream what;
    what << "AsyncOptimizer: clip_grad_norm must be finite and > 0, got " << *v;
    throw ScalerError(errc::bad_option, what.str());
  }
  clip_grad_norm_ = v;
  return *this;
}

namespace {
/// Data parallel: the squares of opt's gradients (param-group order, one per defined one), each
/// master's measured by the pieces the sharded layout over `masters` (the model's order) would
/// cut it into, so that sharded and unsharded ranks clip alike (piece_square).
std::vector<double> rank_squares(const torch::optim::Optimizer& opt,
                                 const std::vector<at::Tensor>& masters, int world) {
  std::vector<std::int64_t> numels;
  std::unordered_map<const void*, std::size_t> index;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    numels.push_back(masters[i].numel());
    index.emplace(masters[i].unsafeGetTensorImpl(), i);
  }
  const ShardLayout layout(numels, world);
  std::vector<double> squares;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      const auto at = index.find(p.unsafeGetTensorImpl());
      squares.push_back(at == index.end() ? squared_norm(g) : piece_square(g, layout, at->second));
    }
  return squares;
}
}  // namespace

std::function<void()> AsyncOptimizer::clipping(torch::optim::Optimizer& opt,
                                               std::function<void()> fn) {
  const std::optional<double> max = options_.clip_grad_norm();
  if (!max) return fn;
  // In fn's job, after the grad move or check of the same iteration and before fn's step.
  return [this, &opt, max = *max, fn = std::move(fn)] {
    JobContext* job = JobContext::current();
    const std::shared_ptr<RankGroup>& ranks = scaler().options().ranks();
    if (ranks && ranks->size() > 1) {  // the moved grads are opt's own (no fused check)
      const std::vector<double> squares = rank_squares(opt, masters_, ranks->size());
      grad_norm_ = job->clip_grad_norm_(opt, max, &squares);
    } else {
      grad_norm_ = job->clip_grad_norm_(opt, max);
    }
    if (fn) fn();
  };
}

void AsyncOptimizer::run_step(const std::function<void()>& fn) {
  iteration_t k = -1;
  // As a queued job's error: the others' next collective names this rank and the reason, and
  // this rank, which may have skipped a collective they make, takes part in none from here.
  auto tell = [&](const std::string& what) {
    if (k < 0) return;  // fn never ran: an earlier job's error, told already
    if (const auto& ranks = scaler().options().ranks())
      ranks->fail("its step job in iteration " + std::to_string(k) + " threw: " + what);
  };
  try {
    scaler().run_on_optimizer([&] {
      k = JobContext::current()->iteration();
      fn();
    });
  } catch (const ScalerError& e) {
    if (e.code() != errc::rank_failed) tell(e.what());  // a collective's names its rank already
    throw;
  } catch (const std::exception& e) {
    tell(e.what());
    throw;
  } catch (...) {
    tell("unknown exception in a step job");
    throw;
  }
}

void AsyncOptimizer::warn_uncleared_grads() {
  last_grads_.resize(model_.size(), c10::weak_intrusive_ptr<c10::TensorImpl>(
                                        c10::intrusive_ptr<c10::TensorImpl>()));
  last_versions_.resize(model_.size(), 0);
  for (std::size_t i = 0; i < model_.size(); ++i) {
    const at::Tensor& g = model_[i].grad();
    if (!g.defined()) {
      last_grads_[i] =
          c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>());
      continue;
    }
    // Cleared in place, a gradient's version moves by 2 (zero_, then the accumulation); set to
    // none, it is another tensor. The same one moved by 1: backward added to the last step's.
    if (!warned_uncleared_ && last_grads_[i].lock().get() == g.unsafeGetTensorImpl() &&
        g._version() == last_versions_[i] + 1) {
      warned_uncleared_ = true;
      std::cerr << "ampactor: AsyncOptimizer::step: the model's gradient " << i
                << " was added to the last step's, not cleared since: call the model's "
                   "zero_grad() (the optimizer's zero_grad() clears the masters' gradients, "
                   "which the pipeline does not read). Said once.\n";
    }
    last_grads_[i] = c10::weak_intrusive_ptr<c10::TensorImpl>(g.getIntrusivePtr());
    last_versions_[i] = std::int64_t(g._version());
  }
}

AsyncOptimizer& AsyncOptimizer::name_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  torch::OrderedDict<std::string, at::Tensor> masters;
  for (const auto& item : named) {
    std::size_t i = 0;
    while (i < model_.size() && !model_[i].is_same(item.value()))
      ++i;
    if (i == model_.size())
      throw ScalerError(errc::bad_parameters, "AsyncOptimizer::name_parameters: '" + item.key() +
                                                  "' is not one of the model's parameters the "
                                                  "pipeline was built on; nothing was named");
    if (!shard_) {
      masters.insert(item.key(), masters_[i]);
      continue;
    }
    // Sharded: this rank's pieces of it, "name" when whole, else "name[first:end]".
    const auto& pieces = shard_->pieces();
    for (std::size_t j = 0; j < pieces.size(); ++j)
      if (pieces[j].param == i)
        masters.insert(pieces[j].length == model_[i].numel()
                           ? item.key()
                           : item.key() + "[" + std::to_string(pieces[j].offset) + ":" +
                                 std::to_string(pieces[j].offset + pieces[j].length) + "]",
                       masters_[j]);
  }
  scaler().name_parameters(masters);
  return *this;
}

}  // namespace ampactor
