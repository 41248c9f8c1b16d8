// ampactor-replay --rule: a recorded run's found_inf sequence under several update rules side
// by side, as a table, a CSV and a gnuplot PNG.
#pragma once

#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <ostream>
#include <string>
#include <vector>

namespace ampactor::tools {

struct RuleRun {
  std::string label;  // the spec as given
  TraceHeader settings;
  WhatIfResult result;
};

/// "name[:key=value,...]" (name: torch, deepspeed, megatron, apex, colossalai, keras, tf, jmp)
/// over the recorded settings: the recorded policy, init scale, factors and interval, with the
/// rule's own fields from its preset (hysteresis, min/max scale, deepspeed's flags; a one-factor
/// rule's backoff is 1 / growth; apex and keras take 2 and 0.5), then the overrides: init_scale,
/// growth_factor, backoff_factor, growth_interval, min_scale, max_scale, hysteresis,
/// consecutive_hysteresis, raise_at_min_scale (0 or 1), policy (exact or lagged). Throws
/// std::invalid_argument, or ScalerError for settings a scaler refuses, with the reason.
TraceHeader parse_rule_spec(const std::string& spec, const TraceHeader& recorded);

/// Per iteration the recorded scale and each rule's, with backoffs and growths; then the counts.
void print_rules(std::ostream& out, const std::vector<RuleRun>& runs, bool quiet);
/// k, found_inf, recorded_scale, then <label> scale and backoff per rule (empty after a halt).
std::string rules_csv(const std::vector<RuleRun>& runs);
/// A gnuplot script drawing `csv` into `png`: one panel per rule (small multiples, so no run hides
/// another), the recorded scale in grey behind it, overflowed iterations marked, log2 scale axis.
std::string rules_gnuplot(const std::string& csv, const std::string& png,
                          const std::vector<RuleRun>& runs);
/// A gnuplot script drawing layer_csv's `csv` into `png`: one horizontal bar per layer, its
/// iterations with inf or NaN (and with a what-if, those that still overflow beside them).
std::string layers_gnuplot(const std::string& csv, const std::string& png, const LayerReport& r);

}  // namespace ampactor::tools
