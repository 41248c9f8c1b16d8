// The fields of each traced message, by name: one list serves writing and reading. Version 1's
// messages that version 2 replaced are here too, to be read and turned into version 2 values.
// Internal to the trace library.
#pragma once

#include <ampactor/trace/trace.h>

#include <string>

namespace ampactor::trace_detail {

template <class F>
void fields(F& f, ScaleRequest& x) {
  f("k", x.k);
}
template <class F>
void fields(F& f, ScaleReply& x) {
  f("k", x.k), f("scale", x.scale), f("backoffs_in_row", x.guard.backoffs_in_row),
      f("collapsing", x.guard.collapsing);
}
template <class F>
void fields(F& f, OverflowTensor& x) {
  f("name", x.name), f("index", x.index), f("inf", x.inf), f("nan", x.nan),
      f("neighbours_max", x.neighbours_max);
}
template <class F>
void fields(F& f, UnscaleDone& x) {
  f("k", x.k), f("optimizer", x.optimizer), f("found_inf", x.found_inf),
      f("scale_used", x.scale_used), f("grad_max", x.grad_max), f("dtype_max", x.dtype_max),
      f("local_found_inf", x.local_found_inf), f("overflow", x.overflow), f("found_by", x.found_by);
}
template <class F>
void fields(F& f, UpdateScale& x) {
  f("k", x.k), f("unscales", x.unscales);
}
template <class F>
void fields(F& f, UpdateWhenClosed& x) {
  f("k", x.k);
}
template <class F>
void fields(F& f, SetScale& x) {
  f("k", x.k), f("new_scale", x.new_scale), f("after_jobs", x.after_jobs);
}
template <class F>
void fields(F& f, IterationClosed& x) {
  f("k", x.k), f("unscales", x.unscales), f("abandoned", x.abandoned);
}
template <class F>
void fields(F& f, GetParams& x) {
  f("up_to_date", x.up_to_date);
}
template <class F>
void fields(F& f, SetGrowthFactor& x) {
  f("value", x.value);
}
template <class F>
void fields(F& f, SetBackoffFactor& x) {
  f("value", x.value);
}
template <class F>
void fields(F& f, SetGrowthInterval& x) {
  f("value", x.value);
}
template <class F>
void fields(F&, GetStateDict&) {}
template <class F>
void fields(F& f, StateDictMsg& x) {
  f("empty", x.empty), f("scale", x.scale), f("growth_factor", x.growth_factor),
      f("backoff_factor", x.backoff_factor), f("growth_interval", x.growth_interval),
      f("growth_tracker", x.growth_tracker), f("has_hysteresis_tracker", x.has_hysteresis_tracker),
      f("hysteresis_tracker", x.hysteresis_tracker);
}
template <class F>
void fields(F& f, LoadStateDict& x) {
  f("state", x.state);
}
template <class F>
void fields(F& f, TraceSubscribe& x) {
  f("subscriber", x.subscriber);
}
template <class F>
void fields(F& f, TraceUnsubscribe& x) {
  f("subscriber", x.subscriber);
}
template <class F>
void fields(F& f, ScaleParams& x) {
  f("applied_through", x.applied_through), f("scale", x.scale), f("growth_factor", x.growth_factor),
      f("backoff_factor", x.backoff_factor), f("growth_interval", x.growth_interval),
      f("growth_tracker", x.growth_tracker);
}
template <class F>
void fields(F& f, UpdateApplied& x) {
  f("k", x.k), f("scale", x.scale), f("growth_tracker", x.growth_tracker),
      f("found_inf", x.found_inf), f("backed_off", x.backed_off), f("grew", x.grew),
      f("abandoned", x.abandoned), f("halted", x.halted), f("below_one", x.below_one),
      f("backoffs_in_row", x.guard.backoffs_in_row), f("collapsing", x.guard.collapsing);
}
template <class F>
void fields(F& f, TraceErrorReply& x) {
  f("code", x.code), f("what", x.what);
}

template <class T>
struct TypeName;
#define AMPACTOR_TRACE_NAME(T, name)           \
  template <>                                  \
  struct TypeName<T> {                         \
    static constexpr const char* value = name; \
  };
AMPACTOR_TRACE_NAME(ScaleRequest, "ScaleRequest")
AMPACTOR_TRACE_NAME(UnscaleDone, "UnscaleDone")
AMPACTOR_TRACE_NAME(UpdateScale, "UpdateScale")
AMPACTOR_TRACE_NAME(UpdateWhenClosed, "UpdateWhenClosed")
AMPACTOR_TRACE_NAME(SetScale, "SetScale")
AMPACTOR_TRACE_NAME(IterationClosed, "IterationClosed")
AMPACTOR_TRACE_NAME(GetParams, "GetParams")
AMPACTOR_TRACE_NAME(SetGrowthFactor, "SetGrowthFactor")
AMPACTOR_TRACE_NAME(SetBackoffFactor, "SetBackoffFactor")
AMPACTOR_TRACE_NAME(SetGrowthInterval, "SetGrowthInterval")
AMPACTOR_TRACE_NAME(GetStateDict, "GetStateDict")
AMPACTOR_TRACE_NAME(LoadStateDict, "LoadStateDict")
AMPACTOR_TRACE_NAME(TraceSubscribe, "Subscribe")
AMPACTOR_TRACE_NAME(TraceUnsubscribe, "Unsubscribe")
AMPACTOR_TRACE_NAME(ScaleReply, "ScaleReply")
AMPACTOR_TRACE_NAME(ScaleParams, "ScaleParams")
AMPACTOR_TRACE_NAME(StateDictMsg, "StateDict")
AMPACTOR_TRACE_NAME(UpdateApplied, "UpdateApplied")
AMPACTOR_TRACE_NAME(TraceErrorReply, "Error")
#undef AMPACTOR_TRACE_NAME

/// Whether a message has a k of its own, which must equal its event's.
template <class T, class = void>
struct has_k : std::false_type {};
template <class T>
struct has_k<T, std::void_t<decltype(T::k)>> : std::true_type {};

constexpr int errc_last = static_cast<int>(errc::rank_failed);

inline const char* policy_name(ScalePolicy p) {
  return p == ScalePolicy::lagged ? "lagged" : "exact";
}

/// The header's options as plain values (the schema's field names), between the file and the
/// checked setters of GradScalerOptions.
struct OptionValues {
  double init_scale = 0, growth_factor = 0, backoff_factor = 0;
  std::int64_t growth_interval = 0;
  bool enabled = false, allow_fp16_grads = false;

  OptionValues() = default;
  explicit OptionValues(const GradScalerOptions& o)
      : init_scale(o.init_scale()),
        growth_factor(o.growth_factor()),
        backoff_factor(o.backoff_factor()),
        growth_interval(o.growth_interval()),
        enabled(o.enabled()),
        allow_fp16_grads(o.allow_fp16_grads()) {}
  template <class F>
  void apply(F& f) {
    f("init_scale", init_scale), f("growth_factor", growth_factor),
        f("backoff_factor", backoff_factor), f("growth_interval", growth_interval),
        f("enabled", enabled), f("allow_fp16_grads", allow_fp16_grads);
  }
  /// Throws ScalerError for a value a setter refuses.
  GradScalerOptions options() const {
    return GradScalerOptions::positional(init_scale, growth_factor, backoff_factor, growth_interval,
                                         enabled, allow_fp16_grads);
  }
};

/// The header's update rule (an optional "rule" object in "options", written only for a rule
/// other than torch's plain one), between the file and GradScalerOptions' checked setters.
struct RuleValues {
  std::string kind = "torch";
  double min_scale = 0, max_scale = INFINITY;
  std::int64_t hysteresis = 1;
  bool consecutive_hysteresis = false, raise_at_min_scale = false;

  RuleValues() = default;
  explicit RuleValues(const GradScalerOptions& o)
      : kind(rule_name(o.rule())),
        min_scale(o.min_scale()),
        max_scale(o.max_scale()),
        hysteresis(o.hysteresis()),
        consecutive_hysteresis(o.consecutive_hysteresis()),
        raise_at_min_scale(o.raise_at_min_scale()) {}
  /// Whether a header needs the object (torch's rule without bounds does not).
  bool needed() const { return RuleValues() != *this; }
  bool operator!=(const RuleValues& o) const {
    return kind != o.kind || min_scale != o.min_scale || max_scale != o.max_scale ||
           hysteresis != o.hysteresis || consecutive_hysteresis != o.consecutive_hysteresis ||
           raise_at_min_scale != o.raise_at_min_scale;
  }
  template <class F>
  void apply(F& f) {
    f("kind", kind), f("min_scale", min_scale), f("max_scale", max_scale),
        f("hysteresis", hysteresis), f("consecutive_hysteresis", consecutive_hysteresis),
        f("raise_at_min_scale", raise_at_min_scale);
  }
  /// `o` with this rule; throws ScalerError for a value a setter refuses.
  void set(GradScalerOptions& o) const {
    const auto k = rule_from_name(kind);
    if (!k) throw ScalerError(errc::bad_rule, "unknown rule \"" + kind + "\"");
    o.rule(*k)
        .min_scale(min_scale)
        .max_scale(max_scale)
        .hysteresis(hysteresis)
        .consecutive_hysteresis(consecutive_hysteresis)
        .raise_at_min_scale(raise_at_min_scale);
  }
};

/// The header's scale-collapse guard (an optional "guard" object in "options", since version 7,
/// written only where it differs from the defaults).
struct GuardValues {
  std::int64_t collapse_backoffs = 10;
  double collapse_below = 1.0;
  bool raise_on_collapse = false;

  GuardValues() = default;
  explicit GuardValues(const GradScalerOptions& o)
      : collapse_backoffs(o.collapse_backoffs()),
        collapse_below(o.collapse_below()),
        raise_on_collapse(o.raise_on_collapse()) {}
  bool needed() const {
    const GuardValues d;
    return collapse_backoffs != d.collapse_backoffs || collapse_below != d.collapse_below ||
           raise_on_collapse != d.raise_on_collapse;
  }
  template <class F>
  void apply(F& f) {
    f("collapse_backoffs", collapse_backoffs), f("collapse_below", collapse_below),
        f("raise_on_collapse", raise_on_collapse);
  }
  /// `o` with this guard; throws ScalerError for a value a setter refuses.
  void set(GradScalerOptions& o) const {
    o.collapse_backoffs(collapse_backoffs)
        .collapse_below(collapse_below)
        .raise_on_collapse(raise_on_collapse);
  }
};

// ---- version 1's messages that version 2 replaced ----
namespace v1 {
enum class Param : std::uint8_t { growth_factor, backoff_factor, growth_interval };
inline const char* param_name(Param p) {
  switch (p) {
    case Param::growth_factor:
      return "growth_factor";
    case Param::backoff_factor:
      return "backoff_factor";
    case Param::growth_interval:
      return "growth_interval";
  }
  return "?";
}
struct UpdateScale {
  iteration_t k = 0;
  std::int32_t expected_unscales = 0;  // -1: the optimizer tells (UpdateWhenClosed)
  bool has_new_scale = false;          // SetScale
  double new_scale = 0;
};
struct GetParams {
  iteration_t k = 0;
  bool up_to_date = false;
};
struct SetParam {
  iteration_t k = 0;
  Param which = Param::growth_factor;
  double value = 0;
};
struct GetStateDict {
  iteration_t k = 0;
};
struct LoadStateDict {
  iteration_t k = 0;
  StateDictMsg state;
};
template <class F>
void fields(F& f, UpdateScale& x) {
  f("k", x.k), f("expected_unscales", x.expected_unscales), f("has_new_scale", x.has_new_scale),
      f("new_scale", x.new_scale);
}
template <class F>
void fields(F& f, GetParams& x) {
  f("k", x.k), f("up_to_date", x.up_to_date);
}
template <class F>
void fields(F& f, SetParam& x) {
  f("k", x.k), f("which", x.which), f("value", x.value);
}
template <class F>
void fields(F& f, GetStateDict& x) {
  f("k", x.k);
}
template <class F>
void fields(F& f, LoadStateDict& x) {
  f("k", x.k), f("state", x.state);
}
}  // namespace v1

}  // namespace ampactor::trace_detail
