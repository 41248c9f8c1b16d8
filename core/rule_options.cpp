// The update rules' options: their setters, the presets with each peer's defaults, and which
// fields each kind takes.
#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>

#include <cmath>
#include <limits>

namespace ampactor {

namespace {

[[noreturn]] void bad_rule(const std::string& what) {
  throw ScalerError(errc::bad_rule, what);
}

/// Whether a bound may be inf (no bound).
enum class Bound { finite, or_inf };

/// A bound is checked as the float it is applied as.
void check_bound(const char* name, double v, Bound kind) {
  const bool may_be_inf = kind == Bound::or_inf;
  const float f = static_cast<float>(v);
  if (std::isnan(v) || v < 0 || (std::isinf(v) && !may_be_inf) || (may_be_inf && v == 0) ||
      (!std::isinf(v) && (std::isinf(f) || (v > 0 && f == 0.0f))))
    bad_rule(std::string("The ") + name + " must be " + (may_be_inf ? "inf or " : "0 or ") +
             "finite and > 0 as a float. Got " + show_value(v) + ".");
}

}  // namespace

GradScalerOptions& GradScalerOptions::min_scale(double v) {
  check_bound("min scale", v, Bound::finite);
  min_scale_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::max_scale(double v) {
  check_bound("max scale", v, Bound::or_inf);
  max_scale_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::hysteresis(std::int64_t v) {
  if (v < 0 || v > std::numeric_limits<std::int32_t>::max())
    bad_rule("The hysteresis must be >= 0 and fit in int32. Got " + std::to_string(v) + ".");
  hysteresis_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::collapse_backoffs(std::int64_t v) {
  if (v < 0 || v > std::numeric_limits<std::int32_t>::max())
    bad_rule("collapse_backoffs must be >= 0 and fit in int32. Got " + std::to_string(v) + ".");
  collapse_backoffs_ = v;
  return *this;
}

GradScalerOptions& GradScalerOptions::collapse_below(double v) {
  // Checked as the float it is compared in: a threshold beyond float's range would say nothing.
  if (!(v >= 0) || !std::isfinite(float(v)))
    bad_rule("collapse_below must be finite and >= 0 as a float. Got " + show_value(v) + ".");
  collapse_below_ = v;
  return *this;
}

ScaleRule GradScalerOptions::scale_rule() const {
  ScaleRule r{growth_factor_, backoff_factor_, growth_interval_};
  r.kind = rule_;
  r.min_scale = min_scale_;
  r.max_scale = max_scale_;
  r.hysteresis = static_cast<std::int32_t>(hysteresis_);
  r.consecutive_hysteresis = consecutive_hysteresis_;
  r.raise_at_min_scale = raise_at_min_scale_;
  return r;
}

void check_rule(const ScaleRule& r) {
  const std::string name = rule_name(r.kind);
  if (r.min_scale > 0 && r.max_scale < INFINITY && r.min_scale > r.max_scale)
    bad_rule("The min scale must be <= the max scale. Got " + show_value(r.min_scale) + " > " +
             show_value(r.max_scale) + ".");
  const bool hysteretic = rule_has_hysteresis(r.kind);
  if (!hysteretic && r.hysteresis != 1)
    bad_rule("The " + name + " rule has no hysteresis (it must be 1). Got " +
             std::to_string(r.hysteresis) + ".");
  if (hysteretic && r.kind != RuleKind::colossalai && r.hysteresis < 1)
    bad_rule("The " + name + " rule's hysteresis must be >= 1. Got " +
             std::to_string(r.hysteresis) + ".");
  if (r.kind != RuleKind::deepspeed && (r.consecutive_hysteresis || r.raise_at_min_scale))
    bad_rule(
        "consecutive_hysteresis and raise_at_min_scale belong to the deepspeed rule, not "
        "the " +
        name + " rule.");
  const bool takes_min = r.kind != RuleKind::keras;
  const bool takes_max =
      r.kind == RuleKind::torch || r.kind == RuleKind::apex || r.kind == RuleKind::colossalai;
  if (!takes_min && r.min_scale != 0)
    bad_rule("The " + name + " rule has no min scale. Got " + show_value(r.min_scale) + ".");
  if (!takes_max && r.max_scale != INFINITY)
    bad_rule("The " + name + " rule has no max scale. Got " + show_value(r.max_scale) + ".");
  if (r.kind == RuleKind::tf && r.min_scale != 1.0)
    bad_rule("The tf rule's floor is fixed at 1. Got a min scale of " + show_value(r.min_scale) +
             ".");
  if (rule_fixes_factors(r.kind) && (r.growth_factor != 2.0 || r.backoff_factor != 0.5))
    bad_rule("The " + name + " rule's factors are fixed at 2 and 0.5. Got " +
             show_value(r.growth_factor) + " and " + show_value(r.backoff_factor) + ".");
  if (rule_has_one_factor(r.kind) && r.backoff_factor != 1.0 / r.growth_factor)
    bad_rule("The " + name +
             " rule backs off by dividing by growth_factor: backoff_factor must be " +
             show_value(1.0 / r.growth_factor) + " (1 / growth_factor). Got " +
             show_value(r.backoff_factor) + ".");
}

// The presets: deepspeed's config defaults (runtime/constants.py: initial_scale_power 16,
// loss_scale_window 1000, hysteresis 2, min_loss_scale 1; the engine always raises at the
// minimum); megatron's OptimizerConfig (initial_loss_scale 2^32, loss_scale_window 1000,
// hysteresis 2, min_loss_scale 1); apex amp.initialize (2^16, window 2000, max 2^24, no min);
// colossalai's plugins (2^16, 1000, hysteresis 2, min 1, max 2^32); keras (2^15, 2000); tf and
// jmp (2^15, period 2000, floor 1).
GradScalerOptions GradScalerOptions::deepspeed() {
  return GradScalerOptions()
      .rule(RuleKind::deepspeed)
      .init_scale(65536.0)
      .growth_interval(1000)
      .hysteresis(2)
      .min_scale(1.0)
      .raise_at_min_scale(true);
}
GradScalerOptions GradScalerOptions::megatron() {
  return GradScalerOptions()
      .rule(RuleKind::megatron)
      .init_scale(4294967296.0)
      .growth_interval(1000)
      .hysteresis(2)
      .min_scale(1.0);
}
GradScalerOptions GradScalerOptions::apex() {
  return GradScalerOptions().rule(RuleKind::apex).growth_interval(2000).max_scale(16777216.0);
}
GradScalerOptions GradScalerOptions::colossalai() {
  return GradScalerOptions()
      .rule(RuleKind::colossalai)
      .growth_interval(1000)
      .hysteresis(2)
      .min_scale(1.0)
      .max_scale(4294967296.0);
}
GradScalerOptions GradScalerOptions::keras() {
  return GradScalerOptions().rule(RuleKind::keras).init_scale(32768.0).growth_interval(2000);
}
GradScalerOptions GradScalerOptions::tf() {
  return GradScalerOptions().rule(RuleKind::tf).init_scale(32768.0).min_scale(1.0);
}
GradScalerOptions GradScalerOptions::jmp() {
  return GradScalerOptions().rule(RuleKind::jmp).init_scale(32768.0).min_scale(1.0);
}

GradScalerOptions GradScalerOptions::preset(RuleKind kind) {
  switch (kind) {
    case RuleKind::deepspeed:
      return deepspeed();
    case RuleKind::megatron:
      return megatron();
    case RuleKind::apex:
      return apex();
    case RuleKind::colossalai:
      return colossalai();
    case RuleKind::keras:
      return keras();
    case RuleKind::tf:
      return tf();
    case RuleKind::jmp:
      return jmp();
    case RuleKind::torch:
      break;
  }
  return GradScalerOptions();
}

const char* rule_name(RuleKind kind) {
  switch (kind) {
    case RuleKind::torch:
      return "torch";
    case RuleKind::deepspeed:
      return "deepspeed";
    case RuleKind::megatron:
      return "megatron";
    case RuleKind::apex:
      return "apex";
    case RuleKind::colossalai:
      return "colossalai";
    case RuleKind::keras:
      return "keras";
    case RuleKind::tf:
      return "tf";
    case RuleKind::jmp:
      return "jmp";
  }
  return "?";
}

std::optional<RuleKind> rule_from_name(const std::string& name) {
  for (RuleKind k : {RuleKind::torch, RuleKind::deepspeed, RuleKind::megatron, RuleKind::apex,
                     RuleKind::colossalai, RuleKind::keras, RuleKind::tf, RuleKind::jmp})
    if (name == rule_name(k)) return k;
  return std::nullopt;
}

}  // namespace ampactor
