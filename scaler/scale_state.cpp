#include <ampactor/scaler/scale_state.h>

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
      rule_{opts.growth_factor(), opts.backoff_factor(), opts.growth_interval()} {}

void ScaleState::lazy_init() {
  if (scale_) return;
  scale_ = static_cast<float>(init_scale_);
  tracker_ = static_cast<std::int32_t>(init_tracker_);
}

void ScaleState::set_growth_factor(double v) {
  check_growth_factor(v);
  rule_.growth_factor = v;
}
void ScaleState::set_backoff_factor(double v) {
  check_backoff_factor(v);
  rule_.backoff_factor = v;
}
void ScaleState::set_growth_interval(std::int64_t v) {
  check_growth_interval(v);
  rule_.growth_interval = v;
}

UpdateOutcome ScaleState::update(bool found_inf) {
  ScaleRuleState state{*scale_, tracker_};
  const UpdateOutcome out = apply_scale_rule(rule_, state, found_inf);
  scale_ = state.scale;
  tracker_ = state.growth_tracker;
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
  rule_ = {growth_factor, backoff_factor, growth_interval};
}

bool ScaleState::operator==(const ScaleState& o) const {
  return init_scale_ == o.init_scale_ && init_tracker_ == o.init_tracker_ && scale_ == o.scale_ &&
         tracker_ == o.tracker_ && rule_.growth_factor == o.rule_.growth_factor &&
         rule_.backoff_factor == o.rule_.backoff_factor &&
         rule_.growth_interval == o.rule_.growth_interval;
}

}  // namespace ampactor
