#include <ampactor/core/scale_state.h>

#include <iostream>

namespace ampactor {

UpdateOutcome apply_update_rule(float& scale, std::int32_t& growth_tracker, bool found_inf,
                                double growth_factor, double backoff_factor,
                                std::int64_t growth_interval) {
  ScaleRuleState state{scale, growth_tracker};
  const UpdateOutcome out =
      apply_scale_rule({growth_factor, backoff_factor, growth_interval}, state, found_inf);
  scale = state.scale;
  growth_tracker = state.growth_tracker;
  return out;
}

ScaleState::ScaleState(const GradScalerOptions& opts)
    : init_scale_(opts.init_scale()),
      init_hysteresis_(opts.hysteresis()),
      rule_(opts.scale_rule()) {}

void ScaleState::lazy_init() {
  if (scale_) return;
  scale_ = static_cast<float>(init_scale_);
  tracker_ = static_cast<std::int32_t>(init_tracker_);
  hysteresis_ = static_cast<std::int32_t>(init_hysteresis_);
}

void ScaleState::set_growth_factor(double v) {
  check_growth_factor(v);
  ScaleRule r = rule_;
  r.growth_factor = v;
  if (rule_has_one_factor(r.kind)) r.backoff_factor = 1.0 / v;
  check_rule(r);
  rule_ = r;
}
void ScaleState::set_backoff_factor(double v) {
  check_backoff_factor(v);
  if (rule_has_one_factor(rule_.kind))
    throw ScalerError(errc::bad_rule, std::string("The ") + rule_name(rule_.kind) +
                                          " rule has one factor: it backs off by dividing by "
                                          "growth_factor (set that instead).");
  ScaleRule r = rule_;
  r.backoff_factor = v;
  check_rule(r);
  rule_ = r;
}
void ScaleState::set_growth_interval(std::int64_t v) {
  check_growth_interval(v);
  rule_.growth_interval = v;
}

UpdateOutcome ScaleState::update(bool found_inf) {
  ScaleRuleState state{*scale_, tracker_, hysteresis_};
  const UpdateOutcome out = apply_scale_rule(rule_, state, found_inf);
  if (out.at_min_scale)  // DeepSpeed's text
    throw ScalerError(errc::scale_at_minimum, texts::scale_at_minimum);
  scale_ = state.scale;
  tracker_ = state.growth_tracker;
  hysteresis_ = state.hysteresis_tracker;
  if (*scale_ < 1.0f && !said_below_one_) {
    said_below_one_ = true;
    std::cerr << "ampactor: the loss scale fell below 1 (" << *scale_
              << "): gradients are now scaled down, and small ones underflow. A min_scale "
                 "(GradScalerOptions) floors it.\n";
  }
  return out;
}

void ScaleState::set_scale(double new_scale) {
  scale_ = static_cast<float>(new_scale);
}

void ScaleState::load(double scale, double growth_factor, double backoff_factor,
                      std::int64_t growth_interval, std::int64_t growth_tracker) {
  init_scale_ = scale;
  init_tracker_ = growth_tracker;
  if (scale_) {
    scale_ = static_cast<float>(scale);
    tracker_ = static_cast<std::int32_t>(growth_tracker);
  }
  rule_.growth_factor = growth_factor;
  rule_.backoff_factor = backoff_factor;
  rule_.growth_interval = growth_interval;
}

void ScaleState::load_hysteresis(std::int64_t hysteresis_tracker) {
  init_hysteresis_ = hysteresis_tracker;
  if (scale_) hysteresis_ = static_cast<std::int32_t>(hysteresis_tracker);
}

bool ScaleState::operator==(const ScaleState& o) const {
  const ScaleRule& a = rule_;
  const ScaleRule& b = o.rule_;
  return init_scale_ == o.init_scale_ && init_tracker_ == o.init_tracker_ && scale_ == o.scale_ &&
         tracker_ == o.tracker_ && init_hysteresis_ == o.init_hysteresis_ &&
         (!scale_ || hysteresis_ == o.hysteresis_) && a.growth_factor == b.growth_factor &&
         a.backoff_factor == b.backoff_factor && a.growth_interval == b.growth_interval &&
         a.kind == b.kind && a.min_scale == b.min_scale && a.max_scale == b.max_scale &&
         a.hysteresis == b.hysteresis && a.consecutive_hysteresis == b.consecutive_hysteresis &&
         a.raise_at_min_scale == b.raise_at_min_scale;
}

}  // namespace ampactor
