// ampactor-replay: checks that a keeper trace replays bit for bit, or replays its found_inf
// sequence under other settings (what-if) and prints both scale trajectories side by side.
#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include "replay_rules.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace ampactor;

namespace {

void print_counts(const WhatIfResult& r) {
  const auto& a = r.recorded;
  const auto& b = r.whatif;
  std::cout << std::setw(14) << "" << std::setw(14) << "recorded" << std::setw(14) << "what-if"
            << "\n";
  auto row = [](const char* name, auto x, auto y) {
    std::cout << std::setw(14) << std::left << name << std::right << std::setw(14) << x
              << std::setw(14) << y << "\n";
  };
  row("iterations", a.iterations, b.iterations);
  row("skips", a.skips, b.skips);
  row("backoffs", a.backoffs, b.backoffs);
  row("growths", a.growths, b.growths);
  row("final scale", a.final_scale, b.final_scale);
  row("min scale", a.min_scale, b.min_scale);
  std::cout << "found_inf at the what-if scale predicted from the gradients' size: " << r.predicted
            << " iterations (" << r.predicted_changed << " differ from the record)\n"
            << "found_inf at the what-if scale unknown, taken as recorded: " << r.uncertain
            << " iterations (an overflow recorded at a larger scale"
            << (r.predicted == 0 ? ", or a clean step at a smaller one: this trace has no sizes"
                                 : "")
            << ")\n";
}

/// The command line.
struct Options {
  std::string path;
  std::optional<std::string> policy;
  std::optional<double> init_scale, growth_factor, backoff_factor;
  std::optional<std::int64_t> growth_interval;
  std::string csv;
  bool quiet = false;
  bool prefix = false;
  std::vector<std::string> rules;
  std::string plot;
  bool layers = false;
  std::string layers_csv, layers_plot;

  /// Whether any of the what-if options is given.
  bool what() const {
    return policy || init_scale || growth_factor || backoff_factor || growth_interval;
  }
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("TRACE", o.path, "trace file (JSON Lines)")->required();
  app.add_option("--policy", o.policy, "what-if: exact or lagged")
      ->check(CLI::IsMember({"exact", "lagged"}));
  app.add_option("--init-scale", o.init_scale, "what-if: initial scale");
  app.add_option("--growth-factor", o.growth_factor, "what-if: growth factor");
  app.add_option("--backoff-factor", o.backoff_factor, "what-if: backoff factor");
  app.add_option("--growth-interval", o.growth_interval, "what-if: growth interval");
  app.add_option("--csv", o.csv, "what-if: write the trajectories to this CSV file");
  app.add_flag("-q,--quiet", o.quiet, "what-if: counts only, no per-iteration table");
  app.add_option("--rule", o.rules,
                 "compare update rules side by side, each NAME[:key=value,...] over the recorded "
                 "settings (torch, deepspeed, megatron, apex, colossalai, keras, tf, jmp; keys: "
                 "init_scale, growth_factor, backoff_factor, growth_interval, min_scale, "
                 "max_scale, hysteresis, consecutive_hysteresis, raise_at_min_scale, policy); "
                 "repeat it for several");
  app.add_option("--plot", o.plot, "with --rule: draw the scales into this PNG (gnuplot)");
  app.add_flag("--layers", o.layers,
               "per-layer overflow counts (which gradients held inf or NaN, in how many "
               "iterations); with what-if options, which of them would still overflow");
  app.add_option("--layers-csv", o.layers_csv, "--layers into this CSV file");
  app.add_option("--layers-plot", o.layers_plot, "--layers drawn into this PNG (gnuplot)");
  app.add_flag("--prefix", o.prefix,
               "replay the intact part of a damaged or truncated trace, up to its first bad "
               "line (exit 3, saying where and why it stopped)");
}

/// Whether the trace holds the whole recording: empty if so, otherwise why not.
std::string incompleteness(const Trace& trace) {
  if (trace.stopped_at)
    return "the intact part ends before line " + std::to_string(trace.stopped_at) + " (" +
           trace.stop_reason + ")";
  if (!trace.complete) return "no trailer: the recording was cut short (a crash or a kill)";
  return "";
}

/// Writes `csv` into `data` (none when empty) and, when `plot` is given, draws it with the
/// gnuplot script `script()` makes. 0, or 2 with the reason on stderr.
int write_and_plot(const std::string& data, const std::string& csv, const std::string& plot,
                   const std::function<std::string()>& script) {
  if (!data.empty()) {
    std::ofstream out(data);
    out << csv;
    if (!out) {
      std::cerr << "ampactor-replay: cannot write " << data << "\n";
      return 2;
    }
  }
  if (plot.empty()) return 0;
  const std::string gp = plot + ".gp";
  std::ofstream(gp) << script();
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) {
    std::cerr << "ampactor-replay: gnuplot failed or is missing (apt-get install gnuplot-nox); "
                 "the data is in "
              << data << " and the script in " << gp << "\n";
    return 2;
  }
  std::cout << "plot: " << plot << "\n";
  return 0;
}

/// --rule: the rules side by side, their CSV and their plot.
int compare_rules(const Options& o, const Trace& trace, const std::string& incomplete) {
  if (o.what()) {
    std::cerr << "ampactor-replay: --rule takes its settings in its spec (e.g. "
                 "--rule torch:growth_interval=100), not in the other what-if options\n";
    return 2;
  }
  std::vector<tools::RuleRun> runs;
  for (const auto& spec : o.rules) {
    try {
      const TraceHeader settings = tools::parse_rule_spec(spec, trace.header);
      runs.push_back({spec, settings, what_if(trace, settings)});
    } catch (const std::exception& e) {
      std::cerr << "ampactor-replay: " << spec << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (!incomplete.empty()) std::cout << "INCOMPLETE: " << incomplete << "\n";
  tools::print_rules(std::cout, runs, o.quiet);
  const std::string data = !o.csv.empty() ? o.csv : !o.plot.empty() ? o.plot + ".csv" : "";
  return write_and_plot(data, tools::rules_csv(runs), o.plot,
                        [&] { return tools::rules_gnuplot(data, o.plot, runs); });
}

/// No what-if option: whether the trace replays bit for bit.
int check_replay(const Options& o, const Trace& trace, const std::string& incomplete) {
  if (!o.csv.empty()) {
    std::cerr << "ampactor-replay: --csv needs a what-if option\n";
    return 2;
  }
  const ReplayResult r = replay_trace(trace);
  if (r.identical && incomplete.empty()) {
    std::cout << o.path << ": identical (" << r.matched << " events)\n";
    return 0;
  }
  if (r.identical) {
    std::cout << o.path << ": identical as far as it goes (" << r.matched
              << " events), but INCOMPLETE: " << incomplete << "\n";
    return 3;
  }
  if (!incomplete.empty()) std::cout << o.path << ": INCOMPLETE: " << incomplete << "\n";
  std::cout << o.path << ":" << r.line << ": first divergence (" << r.matched
            << " events matched before it)\n"
            << "  expected: " << (r.expected.empty() ? "(nothing: the trace ends)" : r.expected)
            << "\n"
            << "  got:      " << (r.got.empty() ? "(nothing)" : r.got) << "\n";
  return 1;
}

/// The per-iteration table of a what-if replay.
void print_rows(const WhatIfResult& r) {
  std::cout << std::setw(8) << "k" << std::setw(10) << "found_inf" << std::setw(16) << "recorded"
            << std::setw(16) << "what-if"
            << "  events\n";
  for (const auto& w : r.rows) {
    std::cout << std::setw(8) << w.k << std::setw(10) << (w.found_inf ? "inf" : "") << std::setw(16)
              << w.recorded_scale << std::setw(16) << w.whatif_scale << "  "
              << (w.recorded_backoff ? "backoff"
                  : w.recorded_grew  ? "grow"
                                     : "-")
              << " / "
              << (w.whatif_backoff ? "backoff"
                  : w.whatif_grew  ? "grow"
                                   : "-")
              << "\n";
  }
}

/// --layers: the table, and its CSV and plot where asked for.
int print_layers(const Options& o, const LayerReport& r) {
  std::cout << "iterations with inf or NaN: " << r.overflow_iterations;
  if (r.unattributed)
    std::cout << " (" << r.unattributed
              << " without named gradients: a path that does not attribute, or a trace older "
                 "than schema 7)";
  std::cout << "\n";
  for (const auto& [rank, n] : r.ranks)
    std::cout << "found by rank " << rank << " in " << n << " iterations\n";
  std::size_t w = 5;
  for (const auto& l : r.layers)
    w = std::max(w, l.name.size());
  std::cout << std::left << std::setw(int(w) + 2) << "layer" << std::right << std::setw(11)
            << "iterations" << std::setw(6) << "inf" << std::setw(6) << "nan" << std::setw(8)
            << "first" << std::setw(8) << "last";
  if (r.what_if) std::cout << std::setw(8) << "still" << std::setw(9) << "unknown";
  std::cout << "\n";
  for (const auto& l : r.layers) {
    std::cout << std::left << std::setw(int(w) + 2) << l.name << std::right << std::setw(11)
              << l.iterations << std::setw(6) << l.inf << std::setw(6) << l.nan << std::setw(8)
              << l.first << std::setw(8) << l.last;
    if (r.what_if) std::cout << std::setw(8) << l.still << std::setw(9) << l.unknown;
    std::cout << "\n";
  }
  if (r.what_if)
    std::cout << "still: overflows at the what-if scale too (at least the recorded one); "
                 "unknown: a smaller scale, where an inf's size is not known"
              << (r.not_replayed ? "; " + std::to_string(r.not_replayed) +
                                       " iterations the what-if did not replay (it halted "
                                       "before them) are not counted"
                                 : std::string())
              << "\n";
  const std::string data = !o.layers_csv.empty()    ? o.layers_csv
                           : !o.layers_plot.empty() ? o.layers_plot + ".csv"
                                                    : "";
  return write_and_plot(data, layer_csv(r), o.layers_plot,
                        [&] { return tools::layers_gnuplot(data, o.layers_plot, r); });
}

std::string describe(const TraceHeader& h) {
  std::ostringstream o;
  o << (h.policy == ScalePolicy::lagged ? "lagged" : "exact") << ", init " << h.opts.init_scale()
    << ", growth " << h.opts.growth_factor() << ", backoff " << h.opts.backoff_factor()
    << ", interval " << h.opts.growth_interval();
  return o.str();
}

/// The what-if options: the trace's found_inf sequence replayed under those settings (with
/// --layers: per layer).
int replay_what_if(const Options& o, const Trace& trace, const std::string& incomplete) {
  TraceHeader settings = trace.header;
  if (o.policy) settings.policy = *o.policy == "lagged" ? ScalePolicy::lagged : ScalePolicy::exact;
  try {
    if (o.init_scale) settings.opts.init_scale(*o.init_scale);
    if (o.growth_factor) settings.opts.growth_factor(*o.growth_factor);
    if (o.backoff_factor) settings.opts.backoff_factor(*o.backoff_factor);
    if (o.growth_interval) settings.opts.growth_interval(*o.growth_interval);
    settings.opts.validate();
  } catch (const ScalerError& e) {
    std::cerr << "ampactor-replay: what-if settings refused: " << e.what() << "\n";
    return 2;
  }
  const WhatIfResult r = what_if(trace, settings);
  if (o.layers) {
    std::cout << "recorded: " << describe(trace.header) << "\nwhat-if:  " << describe(settings)
              << "\n";
    if (!incomplete.empty()) std::cout << "INCOMPLETE: " << incomplete << "\n";
    return print_layers(o, layer_overflows(trace, &r));
  }
  if (!o.csv.empty()) {
    std::ofstream out(o.csv);
    out << what_if_csv(r);
    if (!out) {
      std::cerr << "ampactor-replay: cannot write " << o.csv << "\n";
      return 2;
    }
  }
  std::cout << "recorded: " << describe(trace.header) << "\nwhat-if:  " << describe(settings)
            << "\n";
  if (!incomplete.empty()) std::cout << "INCOMPLETE: " << incomplete << "\n";
  if (!o.quiet) print_rows(r);
  print_counts(r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Replays a scale_keeper trace into a fresh keeper under CAF's deterministic scheduler.\n"
      "Without what-if options: checks that every reply equals the recorded one (exit 0), or\n"
      "prints the first divergence (exit 1). With any of them: replays the trace's found_inf\n"
      "sequence under those settings and prints both scale trajectories and the counts of\n"
      "skips and backoffs side by side. A trace that cannot be read: exit 2. A trace cut short\n"
      "(no trailer) or read with --prefix up to damage, identical as far as it goes: exit 3."};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (!o.layers_csv.empty() || !o.layers_plot.empty()) o.layers = true;

  Trace trace;
  try {
    trace = read_trace(o.path, o.prefix);
  } catch (const TraceError& e) {
    std::cerr << "ampactor-replay: " << e.what() << "\n";
    if (!o.prefix && e.line() > 1) std::cerr << "(--prefix replays the part before that line)\n";
    return 2;
  }
  // Whether the trace holds the whole recording, said whatever else is printed.
  const std::string incomplete = incompleteness(trace);

  if (!o.rules.empty() && o.layers) {
    std::cerr << "ampactor-replay: --layers takes what-if options, not --rule\n";
    return 2;
  }
  if (!o.rules.empty()) return compare_rules(o, trace, incomplete);
  if (!o.plot.empty()) {
    std::cerr << "ampactor-replay: --plot needs --rule\n";
    return 2;
  }
  if (o.layers && !o.what()) {
    if (!incomplete.empty()) std::cout << "INCOMPLETE: " << incomplete << "\n";
    return print_layers(o, layer_overflows(trace));
  }
  if (!o.what()) return check_replay(o, trace, incomplete);
  return replay_what_if(o, trace, incomplete);
}
