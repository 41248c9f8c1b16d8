#include <ampactor/core/scale_state.h>

#include <iostream>
#include <limits>
#include <sstream>

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
      rule_(opts.scale_rule()),
      collapse_backoffs_(opts.collapse_backoffs()),
      collapse_below_(float(opts.collapse_below())),
      raise_on_collapse_(opts.raise_on_collapse()) {}

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

std::string ScaleState::history(float next) const {
  std::ostringstream s;
  s.precision(std::numeric_limits<float>::max_digits10);
  s << "the last " << backed_off_from_.size() + 1 << " backoffs: ";
  for (float x : backed_off_from_)
    s << x << " -> ";
  s << *scale_ << " -> " << next;
  return s.str();
}

UpdateOutcome ScaleState::update(bool found_inf) {
  ScaleRuleState state{*scale_, tracker_, hysteresis_};
  const UpdateOutcome out = apply_scale_rule(rule_, state, found_inf);
  if (out.at_min_scale)  // DeepSpeed's text
    throw ScalerError(errc::scale_at_minimum, texts::scale_at_minimum);
  // An overflow absorbed by the hysteresis neither ends a run of backoffs nor adds to it.
  const std::int64_t in_row = out.backed_off ? backoffs_in_row_ + 1
                              : out.absorbed ? backoffs_in_row_
                                             : 0;
  const bool many = collapse_backoffs_ > 0 && in_row >= collapse_backoffs_ && !said_backoffs_;
  const bool below = collapse_below_ > 0 && state.scale < collapse_below_ && !said_below_;
  const bool unloadable = state.scale < smallest_scale();
  if (unloadable || (raise_on_collapse_ && (many || below))) {
    std::ostringstream why;  // only here: update() runs every iteration
    why.precision(std::numeric_limits<float>::max_digits10);
    if (unloadable)
      why << "the loss scale would fall to " << state.scale << ", below " << smallest_scale()
          << ", the smallest scale whose reciprocal (the unscale factor) is a finite float: no "
             "checkpoint could hold it";
    else if (many)
      why << "the loss scale backed off " << in_row << " times in a row";
    else
      why << "the loss scale would fall below " << collapse_below_ << " (to " << state.scale << ")";
    throw ScalerError(errc::scale_collapsed, "ampactor: " + why.str() + " (" +
                                                 history(state.scale) +
                                                 "); nothing changed: update(new_scale) or a "
                                                 "load resumes the run");
  }
  if (many) {
    said_backoffs_ = true;
    std::cerr << "ampactor: the loss scale backed off " << in_row << " times in a row ("
              << history(state.scale)
              << "): every scale tried overflows, so the inf or NaN may come from the model "
                 "itself (GradScalerOptions::raise_on_collapse stops the run here).\n";
  }
  if (out.backed_off) {
    backed_off_from_.push_back(*scale_);
    if (backed_off_from_.size() > 7) backed_off_from_.pop_front();
  } else if (!out.absorbed) {
    backed_off_from_.clear();
  }
  scale_ = state.scale;
  tracker_ = state.growth_tracker;
  hysteresis_ = state.hysteresis_tracker;
  backoffs_in_row_ = in_row;
  if (below) {
    said_below_ = true;
    std::ostringstream say;  // a stream of its own: std::cerr's precision is the program's
    say.precision(std::numeric_limits<float>::max_digits10);
    say << "ampactor: the loss scale fell below " << collapse_below_ << " (" << *scale_
        << "): gradients are now scaled down, and small ones underflow. A min_scale "
           "(GradScalerOptions) floors it.\n";
    std::cerr << say.str();
  }
  return out;
}

bool ScaleState::collapsing() const {
  return (collapse_backoffs_ > 0 && backoffs_in_row_ >= collapse_backoffs_) ||
         (collapse_below_ > 0 && get_scale() < collapse_below_);
}

void ScaleState::set_scale(double new_scale) {
  scale_ = static_cast<float>(new_scale);
  backoffs_in_row_ = 0;  // a scale the user chose starts the guard's count again
  backed_off_from_.clear();
}

void ScaleState::load(double scale, double growth_factor, double backoff_factor,
                      std::int64_t growth_interval, std::int64_t growth_tracker) {
  init_scale_ = scale;
  init_tracker_ = growth_tracker;
  backoffs_in_row_ = 0;
  backed_off_from_.clear();
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
