#include <ampactor/core/errors.h>
#include <ampactor/core/peer_state_dict.h>

#include <cstdint>
#include <string>

namespace ampactor {

namespace {

[[noreturn]] void bad(RuleKind layout, const std::string& what) {
  throw ScalerError(errc::bad_state_dict, std::string(rule_name(layout)) + " state_dict: " + what);
}

/// A peer's dict must go to (or come from) a scaler with the peer's rule, or the trajectory
/// would not be the peer's.
void check_rule_matches(RuleKind layout, const GradScalerOptions& opts) {
  if (layout != RuleKind::torch && opts.rule() != layout)
    bad(layout, std::string("needs a scaler with the ") + rule_name(layout) +
                    " rule (GradScalerOptions::" + rule_name(layout) + "()), this one has the " +
                    rule_name(opts.rule()) + " rule");
}

/// A setting the peer saves with its state, which ampactor keeps in the options instead.
void check_setting(RuleKind layout, const char* key, double got, double want) {
  if (got != want)
    bad(layout, std::string("['") + key + "'] is " + show_value(got) + ", the scaler's is " +
                    show_value(want) + ": build the scaler with the peer's setting");
}

double get_double(RuleKind layout, const StateDict& sd, const char* key) {
  if (!sd.contains(key)) bad(layout, std::string("missing the key '") + key + "'");
  return sd.get_double(key);
}
std::int64_t get_int(RuleKind layout, const StateDict& sd, const char* key) {
  if (!sd.contains(key)) bad(layout, std::string("missing the key '") + key + "'");
  if (!std::holds_alternative<std::int64_t>(sd.at(key)))
    bad(layout, std::string("['") + key + "'] must be an int, got a float");
  return std::get<std::int64_t>(sd.at(key));
}

/// ampactor's dict: torch's keys, and the hysteresis tracker where the rule has one.
StateDict ours_of(const GradScalerOptions& opts, double scale, double growth, double backoff,
                  std::int64_t interval, std::int64_t tracker, std::int64_t hysteresis) {
  StateDict sd;
  sd.set("scale", scale);
  sd.set("growth_factor", growth);
  sd.set("backoff_factor", backoff);
  sd.set("growth_interval", interval);
  sd.set("_growth_tracker", tracker);
  if (rule_has_hysteresis(opts.rule())) sd.set("_hysteresis_tracker", hysteresis);
  return sd;
}

}  // namespace

StateDict from_peer_state_dict(const StateDict& in, const GradScalerOptions& opts,
                               RuleKind layout) {
  if (layout == RuleKind::torch || in.empty()) return in;
  check_rule_matches(layout, opts);
  const double gf = opts.growth_factor(), bf = opts.backoff_factor();
  const std::int64_t interval = opts.growth_interval(), full = opts.hysteresis();
  switch (layout) {
    case RuleKind::deepspeed: {
      const double factor = get_double(layout, in, "scale_factor");
      const std::int64_t window = get_int(layout, in, "scale_window");
      const std::int64_t iter = get_int(layout, in, "cur_iter");
      const std::int64_t last = get_int(layout, in, "last_overflow_iter");
      const std::int64_t hyst = get_int(layout, in, "cur_hysteresis");
      check_setting(layout, "min_scale", get_double(layout, in, "min_scale"), opts.min_scale());
      check_setting(layout, "delayed_shift", double(get_int(layout, in, "delayed_shift")),
                    double(full));
      if (window < 1) bad(layout, "['scale_window'] must be >= 1, got " + std::to_string(window));
      if (last < -1)  // -1: none yet, as DeepSpeed starts
        bad(layout, "['last_overflow_iter'] must be >= -1, got " + std::to_string(last));
      if (iter <= last)
        bad(layout, "['cur_iter'] must be after ['last_overflow_iter'], got " +
                        std::to_string(iter) + " and " + std::to_string(last));
      if (hyst < 1 || hyst > full)
        bad(layout,
            "['cur_hysteresis'] must be in [1, delayed_shift], got " + std::to_string(hyst));
      // DeepSpeed's next step grows when stable = cur_iter - last_overflow_iter - 1 (the clean
      // steps since the last overflow) is > 0 and a multiple of scale_window; the rule's tracker
      // is that count modulo the window, in [1, window] once there is one (rules.h).
      const std::int64_t stable = (iter - 1) - last;  // cannot overflow: last >= -1
      return ours_of(opts, get_double(layout, in, "cur_scale"), factor, 1.0 / factor, window,
                     stable == 0 ? 0 : 1 + (stable - 1) % window, hyst);
    }
    case RuleKind::megatron:
      return ours_of(opts, get_double(layout, in, "scale"), gf, bf, interval,
                     get_int(layout, in, "growth_tracker"),
                     get_int(layout, in, "hysteresis_tracker"));
    case RuleKind::apex:
      return ours_of(opts, get_double(layout, in, "loss_scale"), gf, bf, interval,
                     get_int(layout, in, "unskipped"), 1);
    case RuleKind::colossalai:
      check_setting(layout, "hysteresis", double(get_int(layout, in, "hysteresis")), double(full));
      // Its step counters are not saved: they restart, as in Colossal-AI.
      return ours_of(opts, get_double(layout, in, "scale"), get_double(layout, in, "growth_factor"),
                     get_double(layout, in, "backoff_factor"), interval, 0, full);
    case RuleKind::keras:
      return ours_of(opts, get_double(layout, in, "dynamic_scale"), gf, bf, interval,
                     get_int(layout, in, "step_counter"), 1);
    case RuleKind::tf:
      return ours_of(opts, get_double(layout, in, "current_loss_scale"), gf, bf, interval,
                     get_int(layout, in, "good_steps"), 1);
    case RuleKind::jmp:
      return ours_of(opts, get_double(layout, in, "loss_scale"), gf, bf, interval,
                     get_int(layout, in, "counter"), 1);
    case RuleKind::torch:
      break;
  }
  return in;
}

StateDict to_peer_state_dict(const StateDict& ours, const GradScalerOptions& opts,
                             RuleKind layout) {
  if (layout == RuleKind::torch || ours.empty()) return ours;
  check_rule_matches(layout, opts);
  const double scale = ours.get_double("scale");
  const std::int64_t tracker = ours.get_int("_growth_tracker");
  const std::int64_t hyst = ours.contains("_hysteresis_tracker")
                                ? ours.get_int("_hysteresis_tracker")
                                : opts.hysteresis();
  StateDict out;
  switch (layout) {
    case RuleKind::deepspeed:
      // At the floor the scale is float(min_scale), which stands for DeepSpeed's min_scale:
      // written as that double, so that DeepSpeed's raise test (cur_scale == min_scale) holds
      // where ampactor's does, not one overflow later.
      out.set("cur_scale", opts.min_scale() > 0 && scale == double(float(opts.min_scale()))
                               ? opts.min_scale()
                               : scale);
      // The tracker is the clean steps since the last overflow, modulo the window (rules.h):
      // DeepSpeed's cur_iter - last_overflow_iter - 1, which is all it reads of the two.
      out.set("cur_iter", tracker);
      out.set("last_overflow_iter", std::int64_t(-1));
      out.set("scale_factor", ours.get_double("growth_factor"));
      out.set("scale_window", ours.get_int("growth_interval"));
      out.set("min_scale", opts.min_scale());
      out.set("delayed_shift", opts.hysteresis());
      out.set("cur_hysteresis", hyst);
      break;
    case RuleKind::megatron:
      out.set("scale", scale);
      out.set("growth_tracker", tracker);
      out.set("hysteresis_tracker", hyst);
      break;
    case RuleKind::apex:
      out.set("loss_scale", scale);
      out.set("unskipped", tracker);
      break;
    case RuleKind::colossalai:
      out.set("scale", scale);
      out.set("growth_factor", ours.get_double("growth_factor"));
      out.set("backoff_factor", ours.get_double("backoff_factor"));
      out.set("hysteresis", opts.hysteresis());
      break;
    case RuleKind::keras:
      out.set("dynamic_scale", scale);
      out.set("step_counter", tracker);
      break;
    case RuleKind::tf:
      out.set("current_loss_scale", scale);
      out.set("good_steps", tracker);
      break;
    case RuleKind::jmp:
      out.set("loss_scale", scale);
      out.set("counter", tracker);
      break;
    case RuleKind::torch:
      break;
  }
  return out;
}

}  // namespace ampactor
