// The demo's closing table and its plot: small multiples, so that no run hides under another.
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

/// Where a run's column `col` lies within `tol` of an earlier run's (a pixel or so apart) at
/// half of the points or more: how many such runs (it is drawn that many steps up, so that it is
/// seen beside them while every other run stays at its true values) and the first of them.
struct Shift {
  int steps = 0;
  std::string near;
  bool equal = false;
};
std::vector<Shift> coinciding(const std::string& dir, const std::vector<Summary>& runs, int col,
                              int from, double tol) {
  std::vector<std::vector<double>> cols;
  std::vector<Shift> shift;
  for (const auto& r : runs) {
    cols.push_back(column(dir + r.mode + ".probe.csv", col, from));
    Shift sh;
    for (std::size_t j = 0; j + 1 < cols.size(); ++j) {
      const auto& a = cols[j];
      const auto& b = cols.back();
      std::size_t near = 0;
      for (std::size_t i = 0; a.size() == b.size() && i < a.size(); ++i)
        near += std::fabs(a[i] - b[i]) <= tol;
      if (!a.empty() && 2 * near >= a.size() && sh.steps++ == 0)
        sh.near = runs[j].mode, sh.equal = a == b;
    }
    shift.push_back(sh);
  }
  return shift;
}

/// One panel's plot clause for run `i`: its column `col` times `scale` from data row `from`,
/// shifted where it coincides with earlier runs (its key says so).
std::string curve(const std::string& dir, const std::string& mode, std::size_t i, int col,
                  double scale, int from, const Shift& shift, double step) {
  std::ostringstream f;
  f << "'" << dir << mode << ".probe.csv' using 1:($" << col + 1 << " * " << scale << " + "
    << shift.steps * step << ") every ::" << from << " with linespoints pt " << i + 1 << " title '"
    << mode;
  if (shift.steps > 0)
    f << " (" << (shift.equal ? "= " : "near ") << shift.near << ", +" << shift.steps * step << ")";
  f << "'";
  return f.str();
}

}  // namespace

void report(const Settings& s, const std::vector<Summary>& runs) {
  std::ofstream sum(s.out + "/summary.csv");
  sum << "mode,train_loss,eval_loss,skipped,backoffs,final_scale,weight_grad_underflow,"
         "activation_grad_underflow,wall_s,it_per_s\n";
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
        << r.wall_s << ',' << ips << '\n';
  }
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
  std::cout << "CSVs and summary: " << s.out << "/\n";
}

void plot(const Settings& s, const std::vector<Summary>& runs) {
  std::vector<std::string> scaled_runs;
  for (const auto& r : runs)
    if (scaled(r.mode)) scaled_runs.push_back(r.mode);
  const std::string gp = s.out + "/demo.gp";
  std::ofstream f(gp);
  const int panels = 3 + int(scaled_runs.size());
  const int rows = (panels + 1) / 2;
  const std::string dir = s.out + "/";
  f << "set terminal pngcairo size 1400," << 360 * rows << " font ',10'\n"
    << "set output '" << dir << "demo.png'\nset datafile separator ','\n"
    << "set multiplot layout " << rows << ",2 title 'ampactor-demo: character-level LM, "
    << (s.device == "cuda" ? "real fp16 on the GPU" : "fp16 emulated on the CPU") << "'\n"
    << "set key top right font ',8'\nset grid\n";
  if (s.spike_length > 0)
    f << "set object 1 rect from " << s.spike_at << ", graph 0 to " << s.spike_at + s.spike_length
      << ", graph 1 fc rgb '#ffe0c0' fs solid behind\n";
  // Eval loss and underflow: every run in one panel at its true values, except that a run
  // within a pixel or so of an earlier run's is drawn a step up (its key says so), so none hides.
  // The loss panel starts at the second probe: the untrained model's loss would stretch the
  // axis until a step is less than a pixel.
  const double loss_step = 0.03, uf_step = 0.1;
  const std::vector<Shift> loss_shift = coinciding(dir, runs, 1, 1, 0.01),
                           uf_shift = coinciding(dir, runs, 2, 0, 0.0005);
  f << "set title 'Eval loss (held-out text; a run near another drawn +" << loss_step
    << " each)'\nset xlabel 'iteration'\nset ylabel 'loss'\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    f << (i ? ", " : "") << curve(dir, runs[i].mode, i, 1, 1, 2, loss_shift[i], loss_step);
  f << "\nset title 'Weight-gradient elements lost to fp16 underflow (%; a run near another +"
    << uf_step << " each)'\nset ylabel '% of non-zero'\nplot ";
  bool first = true;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].mode == "fp32") continue;
    f << (first ? "" : ", ") << curve(dir, runs[i].mode, i, 2, 100, 1, uf_shift[i], uf_step);
    first = false;
  }
  f << "\n";
  // The scale: one panel per scaled run, skipped steps marked, the burst shaded.
  // Headroom above the highest scale keeps the skip marks there off the panel's border.
  f << "set logscale y 2\nset format y '2^{%L}'\nset ylabel 'loss scale'\nset key bottom right\n"
    << "set offsets 0, 0, graph 0.08, 0\n";
  for (const auto& m : scaled_runs) {
    const std::string csv = dir + m + ".csv";
    f << "set title 'Scale: " << m << " (skipped steps marked)'\n"
      << "plot '" << csv << "' using 1:3 every ::1 with steps lw 2 title 'scale', '" << csv
      << "' using 1:($4 > 0 ? $3 : 1/0) every ::1 with points pt 7 ps 1.2 lc rgb 'red' "
         "title 'skipped'\n";
  }
  f << "unset logscale y\nset format y '%g'\nunset object 1\nset offsets 0, 0, 0, 0\n"
    << "set title 'Iterations per second (whole run)'\nset ylabel 'it/s'\nunset xlabel\n"
    << "set style fill solid 0.6\nset boxwidth 0.6\nset xtics rotate by -30 font ',8'\n"
    << "set yrange [0:*]\nplot '" << dir
    << "summary.csv' using 0:10:xtic(1) every ::1 with boxes notitle\n"
    << "unset multiplot\n";
  f.close();
  const std::string cmd = "gnuplot '" + gp + "' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    std::cout << "gnuplot failed or is missing (apt-get install gnuplot-nox); the CSVs and " << gp
              << " are there to plot by hand\n";
  else
    std::cout << "plot: " << dir << "demo.png\n";
}

}  // namespace demo
