// The scale and its update rule, bit for bit torch's `_amp_update_scale_`. No threads, no tensors.
#pragma once

#include <cstdint>
#include <optional>

#include <ampactor/scaler/options.h>

namespace ampactor {

/// What one application of the update rule did.
struct UpdateOutcome {
  bool backed_off = false;      // found_inf: scale *= backoff, tracker reset
  bool grew = false;            // tracker reached the interval and the grown scale was finite
  bool growth_refused = false;  // tracker reached the interval but the grown scale was not finite
};

/// torch's rule on a float scale and an int32 tracker. Products are taken in double (the factors
/// are doubles in torch) and rounded to float once, exactly as torch's kernels do.
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

  double growth_factor() const { return growth_factor_; }
  double backoff_factor() const { return backoff_factor_; }
  std::int64_t growth_interval() const { return growth_interval_; }
  /// Setters check their value (ScalerError) and change nothing when it is refused.
  void set_growth_factor(double v);
  void set_backoff_factor(double v);
  void set_growth_interval(std::int64_t v);

  /// One update after an iteration. Requires initialized().
  UpdateOutcome update(bool found_inf);
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

  bool operator==(const ScaleState& o) const;
  bool operator!=(const ScaleState& o) const { return !(*this == o); }

 private:
  double init_scale_;
  std::int64_t init_tracker_ = 0;
  std::optional<float> scale_;
  std::int32_t tracker_ = 0;
  double growth_factor_;
  double backoff_factor_;
  std::int64_t growth_interval_;
};

}  // namespace ampactor
