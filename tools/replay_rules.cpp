#include "replay_rules.h"

#include <ampactor/core/errors.h>

#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace ampactor::tools {

namespace {

double number(const std::string& key, const std::string& v) {
  std::size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size())
    throw std::invalid_argument("--rule: " + key + "=" + v + " is not a number");
  return d;
}

std::int64_t integer(const std::string& key, const std::string& v) {
  const double d = number(key, v);
  if (d != std::int64_t(d))
    throw std::invalid_argument("--rule: " + key + "=" + v + " is not an integer");
  return std::int64_t(d);
}

bool flag(const std::string& key, const std::string& v) {
  if (v != "0" && v != "1")
    throw std::invalid_argument("--rule: " + key + " takes 0 or 1, got " + v);
  return v == "1";
}

}  // namespace

TraceHeader parse_rule_spec(const std::string& spec, const TraceHeader& recorded) {
  const std::size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const auto kind = rule_from_name(name);
  if (!kind)
    throw std::invalid_argument(
        "--rule: unknown rule \"" + name +
        "\" (torch, deepspeed, megatron, apex, colossalai, keras, tf, jmp)");
  TraceHeader h = recorded;
  GradScalerOptions& o = h.opts;
  const GradScalerOptions p = GradScalerOptions::preset(*kind);
  o.rule(*kind)
      .min_scale(p.min_scale())
      .max_scale(p.max_scale())
      .hysteresis(p.hysteresis())
      .consecutive_hysteresis(p.consecutive_hysteresis())
      .raise_at_min_scale(p.raise_at_min_scale());
  if (rule_fixes_factors(*kind)) o.growth_factor(2).backoff_factor(0.5);
  if (rule_has_one_factor(*kind)) o.backoff_factor(1.0 / o.growth_factor());
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::istringstream items(rest);
  std::string item;
  while (std::getline(items, item, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--rule: expected key=value, got \"" + item + "\"");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "init_scale")
      o.init_scale(number(key, v));
    else if (key == "growth_factor")
      o.growth_factor(number(key, v));
    else if (key == "backoff_factor")
      o.backoff_factor(number(key, v));
    else if (key == "growth_interval")
      o.growth_interval(integer(key, v));
    else if (key == "min_scale")
      o.min_scale(number(key, v));
    else if (key == "max_scale")
      o.max_scale(number(key, v));
    else if (key == "hysteresis")
      o.hysteresis(integer(key, v));
    else if (key == "consecutive_hysteresis")
      o.consecutive_hysteresis(flag(key, v));
    else if (key == "raise_at_min_scale")
      o.raise_at_min_scale(flag(key, v));
    else if (key == "policy" && (v == "exact" || v == "lagged"))
      h.policy = v == "lagged" ? ScalePolicy::lagged : ScalePolicy::exact;
    else
      throw std::invalid_argument("--rule: unknown setting \"" + item + "\"");
  }
  o.validate();
  return h;
}

void print_rules(std::ostream& out, const std::vector<RuleRun>& runs, bool quiet) {
  if (runs.empty()) return;
  const auto& base = runs.front().result.rows;
  if (!quiet) {
    out << std::setw(8) << "k" << std::setw(6) << "inf" << std::setw(14) << "recorded";
    for (const auto& r : runs)
      out << "  " << std::setw(std::max<int>(14, int(r.label.size()))) << r.label;
    out << "\n";
    for (std::size_t i = 0; i < base.size(); ++i) {
      out << std::setw(8) << base[i].k << std::setw(6) << (base[i].found_inf ? "inf" : "")
          << std::setw(14) << base[i].recorded_scale;
      for (const auto& r : runs) {
        std::ostringstream cell;
        if (i < r.result.rows.size()) {
          const auto& w = r.result.rows[i];
          cell << w.whatif_scale << (w.whatif_backoff ? " b" : w.whatif_grew ? " g" : "  ");
        } else {
          cell << "(halted)";
        }
        out << "  " << std::setw(std::max<int>(14, int(r.label.size()))) << cell.str();
      }
      out << "\n";
    }
  }
  out << std::setw(28) << std::left << "" << std::right << std::setw(12) << "skips" << std::setw(10)
      << "backoffs" << std::setw(10) << "growths" << std::setw(14) << "final scale" << std::setw(14)
      << "min scale"
      << "  found_inf predicted (changed) / unknown\n";
  auto line = [&](const std::string& label, const WhatIfCounts& c, const std::string& extra) {
    out << std::setw(28) << std::left << label.substr(0, 27) << std::right << std::setw(12)
        << c.skips << std::setw(10) << c.backoffs << std::setw(10) << c.growths << std::setw(14)
        << c.final_scale << std::setw(14) << c.min_scale << "  " << extra << "\n";
  };
  line("recorded", runs.front().result.recorded, "");
  for (const auto& r : runs) {
    std::string extra = std::to_string(r.result.predicted) + " (" +
                        std::to_string(r.result.predicted_changed) + ") / " +
                        std::to_string(r.result.uncertain);
    if (r.result.halted_at >= 0)
      extra += "; halted at iteration " + std::to_string(r.result.halted_at) +
               " (the scale at its minimum: the peer ends the run)";
    line(r.label, r.result.whatif, extra);
  }
}

std::string rules_csv(const std::vector<RuleRun>& runs) {
  std::ostringstream o;
  o.precision(9);
  o << "k,found_inf,recorded_scale";
  for (const auto& r : runs)
    o << ",\"" << r.label << " scale\",\"" << r.label << " backoff\"";
  o << "\n";
  if (runs.empty()) return o.str();
  const auto& base = runs.front().result.rows;
  for (std::size_t i = 0; i < base.size(); ++i) {
    o << base[i].k << ',' << int(base[i].found_inf) << ',' << base[i].recorded_scale;
    for (const auto& r : runs) {
      if (i < r.result.rows.size())
        o << ',' << r.result.rows[i].whatif_scale << ',' << int(r.result.rows[i].whatif_backoff);
      else
        o << ",,";
    }
    o << "\n";
  }
  return o.str();
}

std::string rules_gnuplot(const std::string& csv, const std::string& png,
                          const std::vector<RuleRun>& runs) {
  std::ostringstream g;
  const std::size_t n = runs.size();
  g << "set terminal pngcairo size 1200," << 220 * n + 80 << "\n"
    << "set output '" << png << "'\nset datafile separator ','\n"
    << "set termoption noenhanced\nset key top left opaque\nset logscale y 2\n"
    << "set offsets 0, 0, graph 0.08, graph 0.08\nset ylabel 'scale'\n"
    << "set multiplot layout " << n << ",1 title 'loss scale per iteration, recorded (grey) "
    << "and under each rule; x: overflow (found_inf)'\n";
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t col = 4 + 2 * i;
    if (i + 1 == n) g << "set xlabel 'iteration'\n";
    g << "plot '" << csv << "' using 1:3 skip 1 with steps lc rgb '#bbbbbb' lw 5 title 'recorded', "
      << "'' using 1:" << col << " skip 1 with steps lc rgb '#1f77b4' lw 1.5 title '"
      << runs[i].label << "', "
      << "'' using 1:($2 > 0 ? $" << col << " : 1/0) skip 1 with points pt 2 ps 1.2 "
      << "lc rgb '#d62728' title 'overflow'\n";
  }
  g << "unset multiplot\n";
  return g.str();
}

std::string layers_gnuplot(const std::string& csv, const std::string& png, const LayerReport& r) {
  std::ostringstream g;
  const std::size_t n = std::max<std::size_t>(r.layers.size(), 1);
  // Rows from the CSV's line 2 on; the first layer (most overflows) on top.
  g << "set terminal pngcairo size 1000," << 120 + 40 * n << "\n"
    << "set output '" << png << "'\nset datafile separator ','\nset termoption noenhanced\n"
    << "set title 'iterations in which each gradient held inf or NaN'\n"
    << "set style fill solid 0.8 border -1\nset key bottom right\nset xrange [0:*]\n"
    << "set yrange [" << n << ":-1]\nset ytics nomirror\nset grid xtics\n"
    << "set xlabel 'iterations'\nbw = " << (r.what_if ? 0.4 : 0.8) << "\n"
    << "plot '" << csv << "' skip 1 using ($2/2):0:($2/2):(bw/2):ytic(1) with boxxyerror "
    << "lc rgb '#d62728' title 'overflowed'";
  if (r.what_if)
    g << ", '' skip 1 using ($7/2):($0+bw):($7/2):(bw/2) with boxxyerror lc rgb '#1f77b4' "
      << "title 'still at the what-if scale'";
  g << "\n";
  return g.str();
}

}  // namespace ampactor::tools
