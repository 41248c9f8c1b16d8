// A scaler's scale, tracker and rule parameters (the rule itself is in update_rule.h). No threads,
// no tensors.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include <ampactor/core/options.h>
#include <ampactor/core/update_rule.h>

namespace ampactor {

/// apply_scale_rule (update_rule.h) with the rule's parameters and state as separate values.
UpdateOutcome apply_update_rule(float& scale, std::int32_t& growth_tracker, bool found_inf,
                                double growth_factor, double backoff_factor,
                                std::int64_t growth_interval);

/// The scale state of one scaler. Like torch, the float scale and int32 tracker come into being
/// lazily at the first scale(); until then get_scale() and the state dict report the initial
/// values exactly as given (as doubles).
class ScaleState {
 public:
  explicit ScaleState(const GradScalerOptions& opts = {});

  bool initialized() const { return scale_.has_value(); }
  /// Creates the float scale and int32 tracker from the initial values (idempotent).
  void lazy_init();

  /// The scale as torch's get_scale() reports it (enabled case).
  double get_scale() const { return scale_ ? double(*scale_) : init_scale_; }
  /// The float scale. Requires initialized().
  float scale() const { return *scale_; }
  /// The inverse for unscaling: the reciprocal in double, rounded to float, as torch computes it.
  float inv_scale() const { return float(1.0 / double(*scale_)); }
  std::int64_t growth_tracker() const { return scale_ ? tracker_ : init_tracker_; }
  /// Overflows the hysteresis still absorbs (rules with hysteresis; see ScaleRuleState).
  std::int64_t hysteresis_tracker() const { return scale_ ? hysteresis_ : init_hysteresis_; }

  double growth_factor() const { return rule_.growth_factor; }
  double backoff_factor() const { return rule_.backoff_factor; }
  std::int64_t growth_interval() const { return rule_.growth_interval; }
  const ScaleRule& rule() const { return rule_; }
  /// Setters check their value (ScalerError) and change nothing when it is refused. Rules with
  /// one factor (deepspeed, tf, jmp) take growth_factor and derive backoff_factor = 1 / it, and
  /// refuse set_backoff_factor; apex and keras refuse both (their factors are fixed).
  void set_growth_factor(double v);
  void set_backoff_factor(double v);
  void set_growth_interval(std::int64_t v);

  /// One update after an iteration. Requires initialized(). The deepspeed rule with
  /// raise_at_min_scale throws ScalerError(scale_at_minimum) where DeepSpeed raises, and changes
  /// nothing. The collapse guard (GradScalerOptions::collapse_backoffs, collapse_below): says
  /// once each on stderr when the scale has backed off that many times in a row and when it
  /// falls below that value, or with raise_on_collapse throws ScalerError(scale_collapsed) with
  /// the last backoffs, changing nothing; an update that would take the scale below
  /// smallest_scale() always throws it.
  UpdateOutcome update(bool found_inf);
  /// Backoffs since the last update that did not back off or absorb an overflow.
  std::int64_t backoffs_in_row() const { return backoffs_in_row_; }
  /// The collapse guard's condition holds for the current scale: collapse_backoffs backoffs in a
  /// row, or a scale below collapse_below (every time, where the warning is said once).
  bool collapsing() const;
  /// An overflow that is not backed off again (the lagged policy's second report of one event):
  /// the tracker restarts, the scale stays. Requires initialized().
  void reset_tracker() { tracker_ = 0; }
  /// update(new_scale): sets the scale (rounded to float), leaves the tracker. Requires
  /// initialized().
  void set_scale(double new_scale);

  /// Loads values as load_state_dict does (checked by the caller): before initialisation they
  /// become the initial values; after, the live ones.
  void load(double scale, double growth_factor, double backoff_factor, std::int64_t growth_interval,
            std::int64_t growth_tracker);
  /// The hysteresis tracker, loaded as load() loads the rest.
  void load_hysteresis(std::int64_t hysteresis_tracker);

  bool operator==(const ScaleState& o) const;
  bool operator!=(const ScaleState& o) const { return !(*this == o); }

 private:
  double init_scale_;
  std::int64_t init_tracker_ = 0;
  std::optional<float> scale_;
  std::int32_t tracker_ = 0;
  std::int64_t init_hysteresis_;
  std::int32_t hysteresis_ = 1;
  ScaleRule rule_;
  // The collapse guard.
  std::int64_t collapse_backoffs_;
  float collapse_below_;
  bool raise_on_collapse_;
  std::int64_t backoffs_in_row_ = 0;
  std::deque<float> backed_off_from_;  // the scales of the last backoffs, oldest first
  bool said_below_ = false, said_backoffs_ = false;
  /// "the last N backoffs: 8 -> 4 -> 2 -> ...", for the guard's texts.
  std::string history(float next) const;
};

}  // namespace ampactor
