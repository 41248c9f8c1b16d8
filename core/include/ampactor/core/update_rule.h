// The dynamic loss-scale update rule, written once for every place that applies it: the scaler
// core (ScaleState), the kernels' CPU path and the one-thread CUDA kernel. No torch and no CUDA
// headers, so a .cu file can include it.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define AMPACTOR_HOST_DEVICE __host__ __device__
#else
#define AMPACTOR_HOST_DEVICE
#endif

namespace ampactor {

/// Whose update rule: torch's (the default) or a peer's, each bit for bit as its published
/// source has it (doc/guide/update-rules.md; the sources and commits are cited in
/// apply_scale_rule).
enum class RuleKind : std::uint8_t { torch, deepspeed, megatron, apex, colossalai, keras, tf, jmp };

/// The rules that keep a hysteresis tracker.
constexpr bool rule_has_hysteresis(RuleKind k) {
  return k == RuleKind::deepspeed || k == RuleKind::megatron || k == RuleKind::colossalai;
}
/// The rules with one factor: they back off by dividing by growth_factor.
constexpr bool rule_has_one_factor(RuleKind k) {
  return k == RuleKind::deepspeed || k == RuleKind::tf || k == RuleKind::jmp;
}
/// The rules whose factors are fixed at 2 and 0.5.
constexpr bool rule_fixes_factors(RuleKind k) {
  return k == RuleKind::apex || k == RuleKind::keras;
}

/// The smallest float scale whose reciprocal, the unscale factor, is a finite float (2^-128 is
/// not: its reciprocal rounds to inf). check_reciprocal_finite (options.h) refuses any smaller
/// scale at init, update(new_scale) and load_state_dict; the deepspeed rule floors its backoff
/// here, so that every scale it reaches loads back.
AMPACTOR_HOST_DEVICE constexpr float smallest_scale() {
  return 0x1.000008p-128f;
}

/// The parameters of the rule, as plain data a kernel takes by value. Which fields a kind uses,
/// and which values it takes, is checked by GradScalerOptions (options.h).
struct ScaleRule {
  double growth_factor;
  double backoff_factor;
  std::int64_t growth_interval;
  RuleKind kind = RuleKind::torch;
  double min_scale = 0;         // a floor; 0: none
  double max_scale = INFINITY;  // a ceiling; inf: none
  /// Overflows it takes to back off (deepspeed's delayed_shift, megatron's and colossalai's
  /// hysteresis); 1: every overflow backs off.
  std::int32_t hysteresis = 1;
  bool consecutive_hysteresis = false;  // deepspeed: a clean step refills the hysteresis
  bool raise_at_min_scale = false;      // deepspeed: a backoff due at min_scale is an error
};

/// What the rule acts on: torch keeps the scale as float and the tracker as int32.
struct ScaleRuleState {
  float scale;
  std::int32_t growth_tracker;
  /// Overflows the hysteresis still absorbs (deepspeed's cur_hysteresis; megatron's
  /// _hysteresis_tracker, which goes below 0; colossalai's hysteresis minus its _hysteresis_step).
  std::int32_t hysteresis_tracker = 1;
};

/// What one application of the update rule did.
struct UpdateOutcome {
  bool backed_off = false;      // found_inf: scale *= backoff, tracker reset
  bool grew = false;            // tracker reached the interval and the grown scale was finite
  bool growth_refused = false;  // tracker reached the interval but the grown scale was not finite
  bool absorbed = false;        // found_inf absorbed by the hysteresis: the scale stays
  /// deepspeed with raise_at_min_scale: a backoff was due with the scale at min_scale. Nothing
  /// changed; the scaler reports the error (deepspeed raises).
  bool at_min_scale = false;
};

namespace detail {
/// std::isfinite is host-only; CUDA's isfinite is its device twin.
AMPACTOR_HOST_DEVICE inline bool finite(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}
}  // namespace detail

/// torch's _amp_update_scale_ and the peers' rules, bit for bit (rules.h has them).
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_scale_rule(const ScaleRule& rule,
                                                           ScaleRuleState& state, bool found_inf);

}  // namespace ampactor

#include <ampactor/core/rules.h>
