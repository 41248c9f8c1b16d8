// LocalGradScaler: torch.amp.GradScaler for LibTorch, on the calling thread only. It is the
// reference that the actor-backed GradScaler must equal, and a drop-in for single-threaded use.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/stage.h>
#include <ampactor/core/state_dict.h>
#include <ampactor/scaler/overflow.h>
#include <ampactor/scaler/step_tracker.h>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ampactor {

/// outputs * scale, the way torch's scale() computes it (a 0-dim float tensor on the outputs'
/// device), so an fp16 output stays fp16 and rounds the same.
at::Tensor scale_by(const at::Tensor& outputs, float scale);
/// scale() of a list: refuses it whole (torch's text) if any output is undefined, else applies
/// `one` to each.
std::vector<at::Tensor> scale_each(const std::vector<at::Tensor>& outputs,
                                   const std::function<at::Tensor(const at::Tensor&)>& one);
/// update(new_scale)'s checks: a finite positive value; a 1-element floating tensor without grad.
void check_new_scale(double new_scale);
double new_scale_value(const at::Tensor& new_scale);

class LocalGradScaler {
 public:
  using LossClosure = std::function<at::Tensor()>;

  explicit LocalGradScaler(const GradScalerOptions& opts = {});
  /// torch's positional constructor: GradScaler(init_scale, growth_factor, backoff_factor,
  /// growth_interval, enabled). The values go through GradScalerOptions' setters, so one no
  /// scaler could hold (e.g. a NaN factor) is refused even when disabled.
  LocalGradScaler(double init_scale, double growth_factor = 2.0, double backoff_factor = 0.5,
                  std::int64_t growth_interval = 2000, bool enabled = true);

  /// outputs * scale, on the outputs' device; the scale is created at the first call. Disabled:
  /// returns the input. An undefined tensor gives torch's ValueError text.
  at::Tensor scale(const at::Tensor& outputs);
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place and records inf/NaN.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// unscale_ if not done yet, then optimizer.step() unless inf/NaN was found. Returns the
  /// optimizer's return value, or nullopt when the step was skipped.
  std::optional<at::Tensor> step(torch::optim::Optimizer& optimizer, LossClosure closure = nullptr);

  /// Updates the scale from the inf checks of every optimizer since the last update.
  void update();
  /// Sets the scale (the tracker is left as is).
  void update(double new_scale);
  /// Sets the scale from a 1-element floating tensor with requires_grad=false (copied).
  void update(const at::Tensor& new_scale);

  /// The current scale; 1.0 when disabled.
  double get_scale() const;
  double get_growth_factor() const { return state_.growth_factor(); }
  void set_growth_factor(double v) { state_.set_growth_factor(v); }
  double get_backoff_factor() const { return state_.backoff_factor(); }
  void set_backoff_factor(double v) { state_.set_backoff_factor(v); }
  std::int64_t get_growth_interval() const { return state_.growth_interval(); }
  void set_growth_interval(std::int64_t v) { state_.set_growth_interval(v); }
  std::int64_t get_growth_tracker() const { return state_.growth_tracker(); }
  bool is_enabled() const { return enabled_; }

  /// torch's keys; empty when disabled.
  StateDict state_dict() const;
  /// Disabled: does nothing. Empty dict: torch's error. Otherwise checked, then loaded.
  void load_state_dict(const StateDict& sd);
  /// state_dict() into `archive`, as torch::optim::Optimizer::save does (torch::save(scaler, f)
  /// with <ampactor/checkpoint/checkpoint.h>).
  void save(torch::serialize::OutputArchive& archive) const;
  /// What save() wrote, checked as load_state_dict: on an error nothing changes.
  void load(torch::serialize::InputArchive& archive);

  /// ampactor extensions: where an optimizer is in the stage machine, and whether its unscale in
  /// this iteration found inf/NaN (nullopt before unscale_/step). No sync needed on the CPU.
  OptState stage(const torch::optim::Optimizer& optimizer) const;
  std::optional<bool> found_inf(const torch::optim::Optimizer& optimizer) const;
  /// Names the parameters for last_overflow() (model->named_parameters(); several calls add
  /// up). Unnamed ones are "param <index>", their index in their optimizer.
  LocalGradScaler& name_parameters(const torch::OrderedDict<std::string, at::Tensor>& named);
  /// Which gradients held inf or NaN in the last iteration whose update() found one (nullopt
  /// before any): each by name, inf or NaN, with its neighbours' largest finite |gradient|.
  /// Made in update() from the kernels' attribution, only when an overflow was found.
  const std::optional<OverflowReport>& last_overflow() const { return last_overflow_; }
  /// The scale state itself (read-only), for comparisons and tracing.
  const ScaleState& scale_state() const { return state_; }
  const GradScalerOptions& options() const { return opts_; }

 private:
  void require_initialized(const char* funcname) const;

  GradScalerOptions opts_;
  bool enabled_;
  ScaleState state_;
  StepTracker tracker_;
  ParameterNames names_;
  std::optional<OverflowReport> last_overflow_;
  std::int64_t updates_ = 0;  // update() calls that counted found_inf
};

}  // namespace ampactor
