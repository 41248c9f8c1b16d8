// JobContext: what a step job does on the optimizer thread (unscale, step, the pipeline's
// moves and checks), reported to the optimizer actor through its virtual reports.
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/scaler/clip.h>

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace ampactor {

namespace {
thread_local JobContext* current_job = nullptr;
}  // namespace

optimizer_id optimizer_id_of(const torch::optim::Optimizer& opt) {
  return static_cast<optimizer_id>(reinterpret_cast<std::uintptr_t>(&opt));
}

JobContext* JobContext::current() noexcept {
  return current_job;
}

JobContext::JobContext(iteration_t k, float scale, ScaleGuard guard, bool enabled,
                       UnscalePermit permit, caf::actor_id runner, StepTracker& tracker)
    : k_(k),
      scale_(scale),
      guard_(guard),
      enabled_(enabled),
      permit_(permit),
      runner_(runner),
      tracker_(tracker) {
  outer_ = current_job;
  current_job = this;
}

JobContext::~JobContext() {
  current_job = outer_;
}

void JobContext::report(const torch::optim::Optimizer& opt, bool found, bool local_found) {
  // The overflow report first: it rides on the UnscaleDone (and into the trace).
  if (found) found_overflow(opt);
  report_unscale(optimizer_id_of(opt), found, local_found, tracker_.grad_size(opt),
                 tracker_.found_by(opt));
}

namespace {
/// torch's inverse: the reciprocal in double, rounded to float.
float inverse(float scale) {
  return float(1.0 / double(scale));
}
}  // namespace

void JobContext::refuse_late_unscale(const torch::optim::Optimizer& opt) const {
  // The unscales counted in advance are this job's to make; any beyond them would come too late.
  if (permit_.kind() != UnscalePermit::Kind::any && unscales_ >= permit_.counted() &&
      tracker_.stage(opt) == OptState::ready)
    throw ScalerError(errc::protocol_misuse,
                      "this step job may not unscale an optimizer: its iteration's unscales were "
                      "already counted (in a pipeline step the grad move unscales; step only the "
                      "optimizer over the pipeline's masters)");
}

bool JobContext::move_and_unscale_(torch::optim::Optimizer& opt,
                                   const std::vector<at::Tensor>& model_grads,
                                   std::vector<at::Tensor>& masters, bool adopt,
                                   const GradReduce& reduce) {
  refuse_late_unscale(opt);
  if (!enabled_) {
    // No scaling: the grads move as they are (inv_scale 1 only reads and converts).
    StepTracker plain(/*allow_fp16_grads=*/true,
                      tracker_.ranks());  // data parallel: averaged all the same
    plain.move_and_unscale_(opt, model_grads, masters, 1.0f, adopt, reduce);
    return false;
  }
  const bool found =
      tracker_.move_and_unscale_(opt, model_grads, masters, inverse(scale_), adopt, reduce);
  moved_.push_back(&opt);
  ++unscales_;
  report(opt, found, *tracker_.local_found_inf(opt));
  return found;
}

bool JobContext::check_for_fused_(torch::optim::Optimizer& opt,
                                  const std::vector<at::Tensor>& model_grads,
                                  std::vector<at::Tensor>& masters,
                                  std::vector<at::Tensor> weights) {
  if (!enabled_) return move_and_unscale_(opt, model_grads, masters);
  refuse_late_unscale(opt);
  const bool found = tracker_.check_for_fused_(opt, model_grads, std::move(weights));
  moved_.push_back(&opt);
  ++unscales_;
  report(opt, found, *tracker_.local_found_inf(opt));
  return found;
}

bool JobContext::record_fused_check_(torch::optim::Optimizer& opt,
                                     const std::vector<at::Tensor>& model_grads,
                                     std::vector<at::Tensor> weights, at::Tensor found,
                                     AbsmaxList absmax) {
  refuse_late_unscale(opt);
  const bool f = tracker_.record_fused_check_(opt, model_grads, std::move(weights),
                                              std::move(found), std::move(absmax));
  moved_.push_back(&opt);
  ++unscales_;
  report(opt, f, *tracker_.local_found_inf(opt));
  return f;
}

bool JobContext::record_agreed_move_(torch::optim::Optimizer& opt, std::vector<at::Tensor> weights,
                                     bool local_found, bool found, GradSize size, AbsmaxList absmax,
                                     std::vector<std::int32_t> found_by) {
  refuse_late_unscale(opt);
  const bool f = tracker_.record_agreed_move_(opt, std::move(weights), local_found, found, size,
                                              std::move(absmax), std::move(found_by));
  moved_.push_back(&opt);
  ++unscales_;
  report(opt, f, local_found);
  return f;
}

double JobContext::clip_grad_norm_(torch::optim::Optimizer& opt, double max_norm,
                                   const std::vector<double>* squares) {
  if (!enabled_) return clip_grads_(grads_of(opt), max_norm, squares);  // moved as they were
  return tracker_.clip_grad_norm_(opt, max_norm, inverse(scale_), squares);
}

void JobContext::write_weights_in_step(const torch::optim::Optimizer& opt,
                                       std::vector<at::Tensor> weights) {
  if (enabled_) tracker_.write_weights_in_step(opt, std::move(weights));
}

bool JobContext::wrote_weights(const torch::optim::Optimizer& opt) const {
  return tracker_.wrote_weights(opt);
}

bool JobContext::unscale_(torch::optim::Optimizer& opt) {
  if (!enabled_) return false;
  if (std::find(moved_.begin(), moved_.end(), &opt) != moved_.end())
    throw ScalerError(errc::unscale_twice,
                      std::string(texts::unscale_twice) +
                          " The pipeline's grad move unscaled this optimizer's gradients: the "
                          "masters' grads are true-sized inside fn, so clip them there without "
                          "unscale_().");
  refuse_late_unscale(opt);
  const bool found = tracker_.unscale_(opt, inverse(scale_));
  // An optimizer without gradients records no inf check (as in torch): nothing to report, so an
  // update() with nothing else raises "No inf checks were recorded prior to update."
  if (!tracker_.has_inf_checks(opt)) return found;
  ++unscales_;
  report(opt, found, *tracker_.local_found_inf(opt));
  return found;
}

StepOutcome JobContext::step(torch::optim::Optimizer& opt,
                             const std::function<at::Tensor()>& closure) {
  if (!enabled_) {
    StepOutcome out;
    out.ret = opt.step(closure);
    return out;
  }
  if (closure) throw ScalerError(errc::closure_unsupported, texts::closure_unsupported);
  refuse_late_unscale(opt);
  const optimizer_id id = optimizer_id_of(opt);
  // The unscale is reported before opt.step() runs: if that throws, the inf checks stand, as in
  // torch, and the keeper still hears of them.
  StepOutcome out = tracker_.step(opt, inverse(scale_), [&](bool found) {
    ++unscales_;
    report(opt, found, *tracker_.local_found_inf(opt));
  });
  report_step(StepResult{k_, id, out.found_inf, out.skipped, scale_, guard_});
  return out;
}

OptState JobContext::stage(const torch::optim::Optimizer& opt) const {
  return tracker_.stage(opt);
}

std::optional<bool> JobContext::found_inf(const torch::optim::Optimizer& opt) const {
  return tracker_.found_inf(opt);
}

}  // namespace ampactor
