#include <ampactor/scaler/scale_state.h>

#include <cmath>

namespace ampactor {

UpdateOutcome apply_update_rule(float& scale, std::int32_t& growth_tracker, bool found_inf,
                                double growth_factor, double backoff_factor,
                                std::int64_t growth_interval) {
  UpdateOutcome out;
  if (found_inf) {
    scale = static_cast<float>(double(scale) * backoff_factor);
    growth_tracker = 0;
    out.backed_off = true;
    return out;
  }
  const std::int32_t successful = growth_tracker + 1;
  // `==`, not `>=`: lowering the interval below the tracker stalls growth until the next
  // backoff, as in torch.
  if (successful == growth_interval) {
    const float grown = static_cast<float>(double(scale) * growth_factor);
    if (std::isfinite(grown)) {
      scale = grown;
      out.grew = true;
    } else {
      out.growth_refused = true;
    }
    growth_tracker = 0;
  } else {
    growth_tracker = successful;
  }
  return out;
}

ScaleState::ScaleState(const GradScalerOptions& opts)
    : init_scale_(opts.init_scale()),
      growth_factor_(opts.growth_factor()),
      backoff_factor_(opts.backoff_factor()),
      growth_interval_(opts.growth_interval()) {}

void ScaleState::lazy_init() {
  if (scale_) return;
  scale_ = static_cast<float>(init_scale_);
  tracker_ = static_cast<std::int32_t>(init_tracker_);
}

void ScaleState::set_growth_factor(double v) {
  check_growth_factor(v);
  growth_factor_ = v;
}
void ScaleState::set_backoff_factor(double v) {
  check_backoff_factor(v);
  backoff_factor_ = v;
}
void ScaleState::set_growth_interval(std::int64_t v) {
  check_growth_interval(v);
  growth_interval_ = v;
}

UpdateOutcome ScaleState::update(bool found_inf) {
  return apply_update_rule(*scale_, tracker_, found_inf, growth_factor_, backoff_factor_,
                           growth_interval_);
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
  growth_factor_ = growth_factor;
  backoff_factor_ = backoff_factor;
  growth_interval_ = growth_interval;
}

bool ScaleState::operator==(const ScaleState& o) const {
  return init_scale_ == o.init_scale_ && init_tracker_ == o.init_tracker_ && scale_ == o.scale_ &&
         tracker_ == o.tracker_ && growth_factor_ == o.growth_factor_ &&
         backoff_factor_ == o.backoff_factor_ && growth_interval_ == o.growth_interval_;
}

}  // namespace ampactor
