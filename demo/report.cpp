// The demo's closing table and its plot: the final figures first, then every run at its true
// values with markers of its own, and a panel per scaled run.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "demo.h"

namespace demo {
namespace {

std::string pct(double v) {
  std::ostringstream o;
  if (v >= 0)
    o << std::fixed << std::setprecision(2) << 100 * v << "%";
  else
    o << "-";
  return o.str();
}

/// Column `col` of a probe CSV from data row `from` (the header left out).
std::vector<double> column(const std::string& path, int col, int from) {
  std::ifstream in(path);
  std::vector<double> out;
  std::string line;
  std::getline(in, line);
  for (int row = 0; std::getline(in, line); ++row) {
    std::istringstream l(line);
    std::string cell;
    for (int i = 0; i <= col && std::getline(l, cell, ','); ++i) {
    }
    if (row >= from) out.push_back(std::atof(cell.c_str()));
  }
  return out;
}

/// For each run, the earlier run whose column `col` (from data row `from`) equals it at every
/// point ("= fp32") or lies within `tol` of it at half of the points or more ("near fp32"): the
/// key says so, while every run is drawn at its true values.
std::vector<std::string> coinciding(const std::string& dir, const std::vector<Summary>& runs,
                                    int col, int from, double tol) {
  std::vector<std::vector<double>> cols;
  std::vector<std::string> note;
  for (const auto& r : runs) {
    cols.push_back(column(dir + r.mode + ".probe.csv", col, from));
    std::string n;
    for (std::size_t j = 0; j + 1 < cols.size() && n.empty(); ++j) {
      const auto& a = cols[j];
      const auto& b = cols.back();
      std::size_t near = 0;
      for (std::size_t i = 0; a.size() == b.size() && i < a.size(); ++i)
        near += std::fabs(a[i] - b[i]) <= tol;
      if (!a.empty() && a == b)
        n = " (= " + runs[j].mode + ")";
      else if (!a.empty() && 2 * near >= a.size())
        n = " (near " + runs[j].mode + ")";
    }
    note.push_back(n);
  }
  return note;
}

/// One curve of run `i`: its column `col` times `scale` from data row `from`, at its true values.
/// Each run has its own marker and dashes, and the markers shrink run by run, so that runs that
/// coincide show as nested markers instead of hiding one another.
std::string curve(const std::string& dir, const std::string& mode, std::size_t i, int col,
                  double scale, int from, const std::string& note) {
  std::ostringstream f;
  f << "'" << dir << mode << ".probe.csv' using 1:($" << col + 1 << " * " << scale
    << ") every ::" << from << " with linespoints pt " << i + 4 << " ps " << 2.2 - 0.2 * double(i)
    << " dt " << i % 5 + 1 << " title '" << mode << note << "'";
  return f.str();
}

/// A scale as the power of two it is ("2^27"), else as a number.
std::string scale_text(double v) {
  int e = 0;
  if (std::frexp(v, &e) == 0.5) return "2^" + std::to_string(e - 1);
  std::ostringstream o;
  o << v;
  return o.str();
}

/// A panel of text: the summary table, in a fixed-width font.
void table_panel(std::ostream& f, const std::vector<Summary>& runs, int steps) {
  f << "set title 'Summary (the table the demo prints)'\nunset border\nunset tics\nunset key\n"
       "unset grid\nunset xlabel\nunset ylabel\n";
  std::ostringstream t;
  t << std::left << std::setw(25) << "mode" << std::right << std::setw(10) << "eval loss"
    << std::setw(7) << "it/s" << std::setw(9) << "skipped" << std::setw(13) << "final scale";
  f << "set label 1 \"" << t.str()
    << "\" at graph 0.02, graph 0.92 font 'Monospace,9' noenhanced\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Summary& r = runs[i];
    std::ostringstream row;
    row << std::left << std::setw(25) << r.mode << std::right << std::fixed << std::setprecision(4)
        << std::setw(10) << r.eval_loss << std::setprecision(1) << std::setw(7) << steps / r.wall_s
        << std::setw(9) << r.skipped << std::setw(13)
        << scale_text(r.final_scale > 0 ? r.final_scale : 1);
    f << "set label " << i + 2 << " \"" << row.str() << "\" at graph 0.02, graph "
      << 0.82 - 0.09 * double(i) << " font 'Monospace,9' noenhanced\n";
  }
  f << "plot [0:1][0:1] 1/0 notitle\nunset label\nset border\nset tics\nset grid\n";
}

/// A bar per run of summary.csv's column `col`, its value written above it.
void bars(std::ostream& f, const std::string& dir, const std::string& title, int col,
          const char* fmt) {
  f << "set title '" << title << "'\nunset xlabel\nset ylabel ''\nset style fill solid 0.6\n"
    << "set boxwidth 0.6\nset xtics rotate by -30 font ',8'\nset yrange [0:*]\n"
    << "set offsets 0, 0, graph 0.15, 0\nplot '" << dir << "summary.csv' using 0:" << col
    << ":xtic(1) every ::1 with boxes notitle, '' using 0:" << col << ":(sprintf('" << fmt << "', $"
    << col << ")) every ::1 with labels offset 0,0.8 notitle\n"
    << "set xtics norotate font ''\nset autoscale y\nset style fill empty\n"
    << "set offsets 0, 0, 0, 0\n";
}

/// The scale of run `m`, its skipped steps marked (the burst shaded by the caller).
void scale_panel(std::ostream& f, const std::string& dir, const std::vector<Summary>& runs,
                 const std::string& m) {
  const std::string csv = dir + m + ".csv";
  std::string layers;  // the layers that overflowed, as the scaler named them
  for (const Summary& r : runs)
    if (r.mode == m && !r.burst_overflowed.empty())
      layers = "\\nthe burst overflowed: " + r.burst_overflowed;
  f << "set title \"Scale: " << m << " (skipped steps marked)" << layers << "\" noenhanced\n"
    << "plot '" << csv << "' using 1:3 every ::1 with steps lw 2 title 'scale', '" << csv
    << "' using 1:($4 > 0 ? $3 : 1/0) every ::1 with points pt 7 ps 1.2 lc rgb 'red' "
       "title 'skipped'\n";
}

/// The scale panels' axes, and the burst shaded.
void scale_axes(std::ostream& f, const Settings& s) {
  if (s.spike_length > 0)
    f << "set object 1 rect from " << s.spike_at << ", graph 0 to " << s.spike_at + s.spike_length
      << ", graph 1 fc rgb '#ffe0c0' fs solid behind\n";
  f << "set logscale y 2\nset format y '2^{%L}'\nset xlabel 'iteration'\nset ylabel 'loss scale'\n"
    << "set key default\nset key bottom right font ',8'\nset offsets 0, 0, graph 0.08, 0\n";
}

void unset_scale_axes(std::ostream& f) {
  f << "unset object 1\nunset logscale y\nset format y '%g'\nset offsets 0, 0, 0, 0\n"
    << "set key default\nset key top right font ',8'\n";
}

const Summary* find(const std::vector<Summary>& runs, const std::string& mode) {
  for (const Summary& r : runs)
    if (r.mode == mode) return &r;
  return nullptr;
}

/// The file's lines, each cut to its first `cols` comma-separated columns (0: whole).
std::vector<std::string> lines(const std::string& path, int cols) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (cols > 0) {
      std::size_t at = 0;
      for (int c = 0; c < cols && at != std::string::npos; ++c)
        at = line.find(',', at ? at + 1 : 0);
      if (at != std::string::npos) line.resize(at);
    }
    out.push_back(line);
  }
  return out;
}

/// A list as one CSV field: "; " between its items, no comma to split on.
std::string csv_field(std::string s) {
  for (std::size_t i = s.find(", "); i != std::string::npos; i = s.find(", ", i))
    s.replace(i, 2, "; ");
  return s;
}

}  // namespace

std::optional<PipelineCase> pipeline_case(const Settings& s, const std::vector<Summary>& runs) {
  const Summary *sync = find(runs, "fp16-sync"), *overlap = find(runs, "fp16-overlap");
  if (!sync || !overlap) return std::nullopt;
  PipelineCase c;
  c.sync_ips = s.steps / sync->wall_s;
  c.overlap_ips = s.steps / overlap->wall_s;
  const std::string dir = s.out + "/";
  // The per-iteration CSVs' iteration, loss, scale and skipped (the last column is a time).
  if (lines(dir + "fp16-sync.csv", 4) != lines(dir + "fp16-overlap.csv", 4))
    c.differs = "the losses, scales or skips of some iteration";
  else if (lines(dir + "fp16-sync.probe.csv", 0) != lines(dir + "fp16-overlap.probe.csv", 0))
    c.differs = "the eval losses during training";
  else if (sync->eval_loss != overlap->eval_loss || sync->final_scale != overlap->final_scale)
    c.differs = "the final eval loss or scale";
  c.equal = c.differs.empty();
  return c;
}

void report(const Settings& s, const std::vector<Summary>& runs) {
  std::ofstream sum(s.out + "/summary.csv");
  sum << "mode,train_loss,eval_loss,skipped,backoffs,final_scale,weight_grad_underflow,"
         "activation_grad_underflow,wall_s,it_per_s,overflowed\n";
  std::cout << "\n"
            << std::left << std::setw(26) << "mode" << std::right << std::setw(11) << "train loss"
            << std::setw(10) << "eval loss" << std::setw(9) << "skipped" << std::setw(10)
            << "backoffs" << std::setw(13) << "final scale" << std::setw(10) << "w-grad uf"
            << std::setw(10) << "act uf" << std::setw(9) << "wall s" << std::setw(8) << "it/s"
            << "\n";
  for (const auto& r : runs) {
    const double ips = s.steps / r.wall_s;
    std::cout << std::left << std::setw(26) << r.mode << std::right << std::fixed
              << std::setprecision(4) << std::setw(11) << r.train_loss << std::setw(10)
              << r.eval_loss << std::setw(9) << r.skipped << std::setw(10) << r.backoffs
              << std::setw(13) << std::defaultfloat << (r.final_scale > 0 ? r.final_scale : 1)
              << std::setw(10) << pct(r.underflow) << std::setw(10) << pct(r.act_underflow)
              << std::fixed << std::setprecision(1) << std::setw(9) << r.wall_s << std::setw(8)
              << ips << "\n";
    sum << r.mode << ',' << r.train_loss << ',' << r.eval_loss << ',' << r.skipped << ','
        << r.backoffs << ',' << r.final_scale << ',' << r.underflow << ',' << r.act_underflow << ','
        << r.wall_s << ',' << ips << ',' << csv_field(r.overflowed) << '\n';
  }
  std::cout << "\nlayers whose gradients overflowed (iterations), as the scaler named them:\n";
  for (const auto& r : runs)
    if (!r.overflowed.empty())
      std::cout << "  " << std::left << std::setw(26) << r.mode << r.overflowed
                << (r.burst_overflowed.empty() ? "" : "; in the burst: " + r.burst_overflowed)
                << "\n";
  std::cout << std::defaultfloat
            << "\nw-grad uf: share of weight-gradient elements that are non-zero in fp32 math "
               "but zero in the fp16 model's gradients\n"
               "act uf:    share of activation-gradient elements that are non-zero before and "
               "zero after rounding to fp16 at the layer boundaries of backward\n"
               "(both measured every "
            << s.probe_every << " iterations, outside the burst)\n";
  if (s.spike_length > 0)
    std::cout << "burst: iterations " << s.spike_at << " to " << s.spike_at + s.spike_length - 1
              << " draw " << s.spike_factor << "x the batch with the usual normalisation\n";
  if (const auto c = pipeline_case(s, runs)) {
    std::cout << std::fixed << std::setprecision(2) << "\nthe pipeline's case: fp16-overlap ";
    if (c->equal)
      std::cout << "ends at fp16-sync's eval loss, losses, scales and skips, bit for bit, ";
    else
      std::cout << "DIFFERS from fp16-sync in " << c->differs << ", ";
    std::cout << "at " << c->ratio() << "x its iterations per second (" << std::setprecision(1)
              << c->overlap_ips << " against " << c->sync_ips << ")\n"
              << std::defaultfloat;
  }
  std::cout << "CSVs and summary: " << s.out << "/; per-iteration metrics: " << s.out
            << "/metrics/; TensorBoard: tensorboard --logdir " << s.out << "/tensorboard\n";
}

namespace {

/// First the pipeline's case: the overlapped backward trains as the synchronous pipeline, bit
/// for bit, and faster; then the two runs' scales; then the final eval loss of every mode.
void case_panels(std::ostream& f, const Settings& s, const std::vector<Summary>& runs,
                 const PipelineCase& c) {
  const std::string dir = s.out + "/";
  f << "set title \"The pipeline's case: fp16-overlap ends at fp16-sync's eval loss"
    << (c.equal ? ", bit for bit" : " NOT bit for bit: " + c.differs)
    << "\" noenhanced\nset xlabel 'iteration'\nset ylabel 'eval loss'\nplot ";
  bool first = true;
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (runs[i].mode == "fp32" || runs[i].mode == "fp16-sync" || runs[i].mode == "fp16-overlap") {
      f << (first ? "" : ", ") << curve(dir, runs[i].mode, i, 1, 1, 2, "");
      first = false;
    }
  f << "\n";
  std::ostringstream ips;
  ips << "Iterations per second (whole run): fp16-overlap " << std::fixed << std::setprecision(2)
      << c.ratio() << "x fp16-sync";
  bars(f, dir, ips.str(), 10, "%.1f");
  scale_axes(f, s);
  scale_panel(f, dir, runs, "fp16-sync");
  scale_panel(f, dir, runs, "fp16-overlap");
  unset_scale_axes(f);
  bars(f, dir, "Eval loss at the end (held-out text; lower is better)", 3, "%.3f");
}

}  // namespace

void plot(const Settings& s, const std::vector<Summary>& runs) {
  std::vector<std::string> scaled_runs;
  for (const auto& r : runs)
    if (scaled(r.mode)) scaled_runs.push_back(r.mode);
  const std::string gp = s.out + "/demo.gp";
  std::ofstream f(gp);
  const std::optional<PipelineCase> c = pipeline_case(s, runs);
  const bool pair = c.has_value();
  const int panels = 5 + int(scaled_runs.size()) + (pair ? 1 : 0);
  const int rows = (panels + 1) / 2;
  const std::string dir = s.out + "/";
  f << "set terminal pngcairo size 1400," << 360 * rows << " font ',10'\n"
    << "set output '" << dir << "demo.png'\nset datafile separator ','\n"
    << "set multiplot layout " << rows << ",2 title 'ampactor-demo: character-level LM, "
    << (s.device == "cuda" ? "real fp16 on the GPU" : "fp16 emulated on the CPU") << "'\n"
    << "set key top right font ',8'\nset grid\n";
  if (pair) {
    case_panels(f, s, runs, *c);
  } else {
    // First what a reader wants: the final eval loss and the speed of every mode.
    bars(f, dir, "Eval loss at the end (held-out text; lower is better)", 3, "%.3f");
    bars(f, dir, "Iterations per second (whole run)", 10, "%.1f");
  }
  // Then the curves, every run at its true values; runs that coincide say so in the key.
  // The loss panel starts at the second probe: the untrained model's loss would stretch the axis.
  if (s.spike_length > 0)
    f << "set object 1 rect from " << s.spike_at << ", graph 0 to " << s.spike_at + s.spike_length
      << ", graph 1 fc rgb '#ffe0c0' fs solid behind\n";
  const std::vector<std::string> loss_note = coinciding(dir, runs, 1, 1, 0.01),
                                 uf_note = coinciding(dir, runs, 2, 0, 0.0005);
  f << "set title 'Eval loss during training'\nset xlabel 'iteration'\nset ylabel 'loss'\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    f << (i ? ", " : "") << curve(dir, runs[i].mode, i, 1, 1, 2, loss_note[i]);
  f << "\nset title 'Weight-gradient elements lost to fp16 underflow (%)'\n"
    << "set ylabel '% of non-zero'\nset key at graph 0.99, graph 0.55 right top\nplot ";
  bool first = true;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].mode == "fp32") continue;
    f << (first ? "" : ", ") << curve(dir, runs[i].mode, i, 2, 100, 1, uf_note[i]);
    first = false;
  }
  f << "\nunset object 1\nset key default\nset key top right font ',8'\n";
  table_panel(f, runs, s.steps);
  // The scale: one panel per scaled run (the pipeline's case showed its two already).
  scale_axes(f, s);
  for (const auto& m : scaled_runs)
    if (!pair || (m != "fp16-sync" && m != "fp16-overlap")) scale_panel(f, dir, runs, m);
  f << "unset multiplot\n";
  f.close();
  const std::string cmd = "gnuplot '" + gp + "' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    std::cout << "gnuplot failed or is missing (apt-get install gnuplot-nox); the CSVs and " << gp
              << " are there to plot by hand\n";
  else
    std::cout << "plot: " << dir << "demo.png\n";
}

}  // namespace demo
