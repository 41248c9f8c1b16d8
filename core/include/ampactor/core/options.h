// Constructor arguments of torch.amp.GradScaler, with its defaults, as named options:
// GradScalerOptions().init_scale(1024).growth_interval(100).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ampactor/core/arg.h>
#include <ampactor/core/errors.h>
#include <ampactor/core/update_rule.h>

namespace ampactor {

class RankGroup;

/// Each setter refuses, with ScalerError and no change, only a value that no scaler could use:
/// a factor that is NaN or infinite (bad_growth_factor, bad_backoff_factor), a growth_interval
/// outside int32 (bad_growth_interval), an init_scale that is NaN or becomes inf or 0 as the float
/// scale (bad_init_scale). The rest (growth_factor > 1, 0 < backoff_factor < 1,
/// growth_interval >= 1, init_scale > 0) is checked only for an enabled scaler, so a disabled one
/// accepts any factors: validate() does those checks and the scalers call it (torch checks
/// growth_factor > 1 and backoff_factor < 1, with the texts used here; the others are ampactor's).
class GradScalerOptions {
  AMPACTOR_ARG(double, init_scale, 65536.0);  // 2^16
  AMPACTOR_ARG(double, growth_factor, 2.0);
  AMPACTOR_ARG(double, backoff_factor, 0.5);
  AMPACTOR_ARG(std::int64_t, growth_interval, 2000);
  AMPACTOR_ARG_ANY(bool, enabled, true);
  /// ampactor extension: let unscale_ take fp16 gradients (torch refuses them with a ValueError).
  AMPACTOR_ARG_ANY(bool, allow_fp16_grads, false);
  /// Whose update rule (doc/guide/update-rules.md); the presets below set a peer's rule together
  /// with its defaults. Which of the next options a rule takes is checked by validate().
  AMPACTOR_ARG_ANY(RuleKind, rule, RuleKind::torch);
  /// A floor (0: none) and a ceiling (inf: none) on the scale, each finite and > 0 as a float.
  AMPACTOR_ARG(double, min_scale, 0.0);
  AMPACTOR_ARG(double, max_scale, INFINITY);
  /// Overflows it takes to back off (deepspeed, megatron, colossalai); an int32.
  AMPACTOR_ARG(std::int64_t, hysteresis, 1);
  /// deepspeed: every clean step refills the hysteresis (so only consecutive overflows count).
  AMPACTOR_ARG_ANY(bool, consecutive_hysteresis, false);
  /// deepspeed: an overflow with the scale at min_scale is an error (errc::scale_at_minimum).
  AMPACTOR_ARG_ANY(bool, raise_at_min_scale, false);
  /// Data parallel (<ampactor/distributed/dist.h>): the ranks whose scalers step or skip together.
  /// Each unscale's found_inf is agreed across them (the maximum) before the scale update hears it,
  /// the pipeline's grad move averages the gradients across them, and the scalers refuse to
  /// start unless every rank has the same options. nullptr (the default): this process alone.
  AMPACTOR_ARG_ANY(std::shared_ptr<RankGroup>, ranks, nullptr);
  /// The scale-collapse guard. By default it warns, once each on stderr, without changing the
  /// trajectory: when the scale has backed off collapse_backoffs times in a row (an int32 >= 0;
  /// 0: never), and when it falls below collapse_below (finite and >= 0; 0: never).
  AMPACTOR_ARG(std::int64_t, collapse_backoffs, 10);
  AMPACTOR_ARG(double, collapse_below, 1.0);
  /// Raise ScalerError(errc::scale_collapsed) with the last backoffs at that update instead of
  /// warning, the state kept as it was (update(new_scale) or a load resumes). Either way an
  /// update that would take the scale below smallest_scale() (a scale no checkpoint can hold:
  /// its reciprocal is not a finite float) raises it.
  AMPACTOR_ARG_ANY(bool, raise_on_collapse, false);

 public:
  /// Throws ScalerError unless growth_factor > 1, 0 < backoff_factor < 1,
  /// 1 <= growth_interval < 2^31 and init_scale is finite and > 0. Like torch, a disabled
  /// scaler's factors are not checked.
  /// torch's positional constructor's values through the setters, in validate()'s order, so a
  /// call with several bad values is refused for the same one.
  static GradScalerOptions positional(double init_scale, double growth_factor,
                                      double backoff_factor, std::int64_t growth_interval,
                                      bool enabled, bool allow_fp16_grads = false);
  void validate() const;

  /// The peers' rules with their own defaults (doc/guide/update-rules.md lists them). Each is a
  /// starting point: every option can still be set after it.
  static GradScalerOptions deepspeed();
  static GradScalerOptions megatron();
  static GradScalerOptions apex();
  static GradScalerOptions colossalai();
  static GradScalerOptions keras();
  static GradScalerOptions tf();
  static GradScalerOptions jmp();
  /// The preset of `kind` (torch: the defaults).
  static GradScalerOptions preset(RuleKind kind);

  /// The update rule these options describe.
  ScaleRule scale_rule() const;
};

/// The options that decide a scale trajectory, as "name=value" words separated by spaces (doubles
/// with 17 digits): what data-parallel ranks compare before they start.
std::string describe(const GradScalerOptions& o);

/// Throws ScalerError(bad_rule) unless `rule`'s kind takes its fields: min_scale and max_scale
/// where the kind has them, hysteresis only for deepspeed, megatron and colossalai, the factors
/// a peer fixes (apex and keras: 2 and 0.5; deepspeed, tf and jmp divide by growth_factor, so
/// backoff_factor must be 1 / growth_factor).
void check_rule(const ScaleRule& rule);
/// "torch", "deepspeed", ...; and back (nullopt for an unknown name).
const char* rule_name(RuleKind kind);
std::optional<RuleKind> rule_from_name(const std::string& name);

/// Individual checks, shared by the constructor, the setters and load_state_dict. torch_text:
/// torch's constructor text alone (torch checks nothing else); otherwise the value is appended.
void check_growth_factor(double v, bool torch_text = false);
void check_backoff_factor(double v, bool torch_text = false);
void check_growth_interval(std::int64_t v);
void check_init_scale(double v);
/// Throws ScalerError(code, texts::float_overflow) for a finite double beyond float's range, as
/// c10 refuses to convert one (inf and NaN are left to the caller's own checks).
void check_fits_float(double v, errc code);
/// Throws ScalerError(code, "<what> must be at least 2.93873728e-39 as a float ...") for a positive
/// float scale whose reciprocal, the unscale factor, is not a finite float (a denormal below
/// 1 / FLT_MAX): every finite gradient would become inf or NaN and no step would be skipped.
void check_reciprocal_finite(float scale, errc code, const char* what);

}  // namespace ampactor
