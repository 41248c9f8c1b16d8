// AsyncOptimizerOptions::clip_grad_norm: clipping by the global 2-norm inside the step's job.
#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/core/errors.h>

#include <cmath>
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

std::function<void()> AsyncOptimizer::clipping(torch::optim::Optimizer& opt,
                                               std::function<void()> fn) {
  const std::optional<double> max = options_.clip_grad_norm();
  if (!max) return fn;
  // In fn's job, after the grad move or check of the same iteration and before fn's step.
  return [this, &opt, max = *max, fn = std::move(fn)] {
    grad_norm_ = JobContext::current()->clip_grad_norm_(opt, max);
    if (fn) fn();
  };
}

}  // namespace ampactor
