// What every schedule of the pipeline shares (internal/pipeline.h): the optimizer's check, the
// step job's clipping and fn, the ranks told of a waited step job's error, the warning when the
// model's gradients were never cleared, and the parameters' names.
#include "internal/pipeline.h"
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/ranks.h>
#include <torch/optim/optimizer.h>
#include "internal/placement.h"
#include "internal/shard_state.h"

#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
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

namespace internal {

void Pipeline::stepping(torch::optim::Optimizer& opt, const std::function<void()>& fn) {
  const bool timed = options.tap() != nullptr;
  const auto t0 =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (const std::optional<double> max = options.clip_grad_norm())
    grad_norm = place->clip(opt, *max);
  if (fn) fn();
  if (timed)
    report_optimizer(JobContext::current()->iteration(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void Pipeline::tell_tap(const std::function<void(PipelineTap&)>& f) noexcept {
  if (!options.tap() || tap_dropped) return;
  try {
    f(*options.tap());
  } catch (const std::exception& e) {
    if (!tap_dropped.exchange(true))
      std::cerr << "ampactor: AsyncOptimizer tap dropped: " << e.what() << "\n";
  }
}

void Pipeline::report_trainer(std::int64_t k, std::chrono::steady_clock::time_point since) {
  const auto now = std::chrono::steady_clock::now();
  const double iteration_s = last_return ? std::chrono::duration<double>(now - *last_return).count()
                                         : std::numeric_limits<double>::quiet_NaN();
  last_return = now;
  tell_tap([&](PipelineTap& t) {
    t.trainer_step(k, std::chrono::duration<double>(now - since).count(), iteration_s);
  });
}

void Pipeline::report_optimizer(std::int64_t k, double step_s) {
  const double norm =
      options.clip_grad_norm() ? grad_norm.load() : std::numeric_limits<double>::quiet_NaN();
  tell_tap([&](PipelineTap& t) { t.optimizer_step(k, step_s, norm); });
}

void Pipeline::check_optimizer(const torch::optim::Optimizer& opt) const {
  std::size_t i = 0;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      if (!master_impls.count(p.unsafeGetTensorImpl()))
        throw ScalerError(errc::bad_parameters,
                          "AsyncOptimizer::step: the optimizer's parameter " + std::to_string(i) +
                              " is not one of optim_parameters(): build the optimizer over "
                              "the pipeline's masters (optim_parameters()), not the model's "
                              "parameters");
      ++i;
    }
}

std::vector<at::Tensor> Pipeline::model_grads() const {
  std::vector<at::Tensor> g;
  g.reserve(model.size());
  for (const at::Tensor& p : model)
    g.push_back(p.grad());
  return g;
}

void Pipeline::run_step(const std::function<void()>& fn) {
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

void Pipeline::warn_uncleared_grads() {
  last_grads.resize(model.size(), c10::weak_intrusive_ptr<c10::TensorImpl>(
                                      c10::intrusive_ptr<c10::TensorImpl>()));
  last_versions.resize(model.size(), 0);
  for (std::size_t i = 0; i < model.size(); ++i) {
    const at::Tensor& g = model[i].grad();
    if (!g.defined()) {
      last_grads[i] =
          c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>());
      continue;
    }
    // Cleared in place, a gradient's version moves by 2 (zero_, then the accumulation); set to
    // none, it is another tensor. The same one moved by 1: backward added to the last step's.
    if (!warned_uncleared && last_grads[i].lock().get() == g.unsafeGetTensorImpl() &&
        g._version() == last_versions[i] + 1) {
      warned_uncleared = true;
      std::cerr << "ampactor: AsyncOptimizer::step: the model's gradient " << i
                << " was added to the last step's, not cleared since: call the model's "
                   "zero_grad() (the optimizer's zero_grad() clears the masters' gradients, "
                   "which the pipeline does not read). Said once.\n";
    }
    last_grads[i] = c10::weak_intrusive_ptr<c10::TensorImpl>(g.getIntrusivePtr());
    last_versions[i] = std::int64_t(g._version());
  }
}

}  // namespace internal

AsyncOptimizer& AsyncOptimizer::name_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  torch::OrderedDict<std::string, at::Tensor> masters;
  for (const auto& item : named) {
    std::size_t i = 0;
    while (i < p_->model.size() && !p_->model[i].is_same(item.value()))
      ++i;
    if (i == p_->model.size())
      throw ScalerError(errc::bad_parameters, "AsyncOptimizer::name_parameters: '" + item.key() +
                                                  "' is not one of the model's parameters the "
                                                  "pipeline was built on; nothing was named");
    if (!p_->shard) {
      masters.insert(item.key(), p_->masters[i]);
      continue;
    }
    // Sharded: this rank's pieces of it, "name" when whole, else "name[first:end]".
    const auto& pieces = p_->shard->pieces();
    for (std::size_t j = 0; j < pieces.size(); ++j)
      if (pieces[j].param == i)
        masters.insert(pieces[j].length == p_->model[i].numel()
                           ? item.key()
                           : item.key() + "[" + std::to_string(pieces[j].offset) + ":" +
                                 std::to_string(pieces[j].offset + pieces[j].length) + "]",
                       p_->masters[j]);
  }
  p_->scaler().name_parameters(masters);
  return *this;
}

}  // namespace ampactor
