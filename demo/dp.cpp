// ampactor-demo --nproc N: the same runs data-parallel over N local ranks (c10d's gloo), beside
// the single-process ones: each rank trains on its shard of every batch, the pipeline averages
// the gradients, and every rank must skip the same steps.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "demo.h"

#ifdef AMPACTOR_DEMO_DIST
#include <ampactor/distributed/dist.h>
#endif

namespace demo {
namespace {

struct Curve {
  std::vector<double> loss;
  std::vector<int> skipped;
};

Curve read_curve(const std::string& csv) {
  std::ifstream f(csv);
  if (!f) throw std::runtime_error("no " + csv + " (did a rank fail?)");
  Curve c;
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream l(line);
    std::string k, loss, scale, skipped;
    std::getline(l, k, ','), std::getline(l, loss, ','), std::getline(l, scale, ',');
    std::getline(l, skipped, ',');
    c.loss.push_back(std::stod(loss));
    c.skipped.push_back(std::stoi(skipped));
  }
  return c;
}

std::string rank_dir(const Settings& s, int r) {
  return s.out + "/dp/rank" + std::to_string(r);
}

}  // namespace

bool is_rank() {
  return std::getenv("RANK") != nullptr;
}

void become_rank(Settings& s) {
#ifdef AMPACTOR_DEMO_DIST
  const ampactor::dist::World world = ampactor::dist::init_from_env();
  s.ranks = world.ranks;  // holds the process group and the store
  s.rank = world.launch.rank;
  s.world = world.launch.world_size;
  s.out = rank_dir(s, s.rank);
  if (!s.trace.empty()) {
    const std::filesystem::path p(s.trace);
    s.trace = (p.parent_path() /
               (p.stem().string() + ".rank" + std::to_string(s.rank) + p.extension().string()))
                  .string();
  }
#else
  (void)s;
  throw std::runtime_error(
      "--nproc: this build has no ampactor::dist (apt-get install libgloo-dev)");
#endif
}

int launch_ranks(const Settings& s, int argc, char** argv) {
#ifdef AMPACTOR_DEMO_DIST
  std::ostringstream cmd;
  cmd << "'" << AMPACTOR_LAUNCH << "' --nproc " << s.nproc << " --master-port 0 --";
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    for (std::size_t at = 0; (at = a.find('\'', at)) != std::string::npos; at += 4)
      a.replace(at, 1, "'\\''");
    cmd << " '" << a << "'";
  }
  std::cout << "\ndata parallel: " << s.nproc << " ranks (ampactor-launch), each on 1/" << s.nproc
            << " of every batch\n"
            << std::flush;
  return std::system(cmd.str().c_str()) == 0 ? 0 : 1;
#else
  (void)s, (void)argc, (void)argv;
  throw std::runtime_error(
      "--nproc: this build has no ampactor::dist (apt-get install libgloo-dev)");
#endif
}

void compare_data_parallel(const Settings& s, const std::vector<Summary>& single) {
  std::cout << "\n"
            << std::left << std::setw(26) << "mode" << std::right << std::setw(16)
            << "1 process loss" << std::setw(16) << (std::to_string(s.nproc) + " ranks loss")
            << std::setw(10) << "skipped" << std::setw(14) << "skipped (dp)"
            << "  same skips on "
            << "every rank\n";
  std::ofstream gp(s.out + "/dp.gp");
  gp << "set terminal pngcairo size 1400," << 380 * ((single.size() + 1) / 2) << " font ',10'\n"
     << "set output '" << s.out << "/dp.png'\nset datafile separator ','\n"
     << "set multiplot layout " << (single.size() + 1) / 2 << ",2 title 'ampactor-demo: " << s.nproc
     << " data-parallel ranks beside one process (train loss; skipped steps "
     << "marked)'\nset grid\nset xlabel 'iteration'\nset ylabel 'train loss'\n";
  for (const Summary& one : single) {
    const Curve base = read_curve(s.out + "/" + one.mode + ".csv");
    std::vector<Curve> ranks;
    for (int r = 0; r < s.nproc; ++r)
      ranks.push_back(read_curve(rank_dir(s, r) + "/" + one.mode + ".csv"));
    bool same = true;
    for (const Curve& c : ranks)
      same = same && c.skipped == ranks[0].skipped;
    // The data-parallel run's loss: the mean of the ranks' (equal shards).
    std::ofstream csv(s.out + "/dp/" + one.mode + ".csv");
    csv << "iteration,loss_one_process,loss_ranks,skipped_one_process,skipped_ranks\n";
    double tail = 0;
    int skips = 0;
    const std::size_t n = std::min(base.loss.size(), ranks[0].loss.size());
    for (std::size_t k = 0; k < n; ++k) {
      double mean = 0;
      for (const Curve& c : ranks)
        mean += c.loss[k] / double(ranks.size());
      if (k + 20 >= n) tail += mean / double(std::min<std::size_t>(20, n));
      skips += ranks[0].skipped[k];
      csv << k << ',' << std::setprecision(9) << base.loss[k] << ',' << mean << ','
          << base.skipped[k] << ',' << ranks[0].skipped[k] << '\n';
    }
    std::cout << std::left << std::setw(26) << one.mode << std::right << std::fixed
              << std::setprecision(4) << std::setw(16) << one.train_loss << std::setw(16) << tail
              << std::setw(10) << one.skipped << std::setw(14) << skips << "  "
              << (same ? "yes" : "NO") << "\n"
              << std::defaultfloat;
    if (!same) throw std::runtime_error(one.mode + ": the ranks skipped different steps");
    const std::string c = s.out + "/dp/" + one.mode + ".csv";
    // Both at their true values: the single process as a thick light line, the ranks' mean as a
    // thin dark dashed one over it, so that where they coincide both stay visible.
    gp << "set title '" << one.mode << "'\nplot '" << c
       << "' using 1:2 every ::1 with lines lw 5 lc rgb '#a0c0ff' title '1 process', '" << c
       << "' using 1:3 every ::1 with lines lw 1.5 dt 2 lc rgb '#102060' title '" << s.nproc
       << " ranks (mean of their losses)', '" << c
       << "' using 1:($4 > 0 ? $2 : 1/0) every ::1 with points pt 7 ps 1.6 lc rgb 'red' "
       << "title 'skipped (1 process)', '" << c
       << "' using 1:($5 > 0 ? $3 : 1/0) every ::1 with points pt 6 ps 2.4 lc rgb "
       << "'black' title 'skipped (ranks)'\n";
  }
  gp << "unset multiplot\n";
  gp.close();
  const std::string cmd = "gnuplot '" + s.out + "/dp.gp' 2>&1";
  if (std::system(cmd.c_str()) == 0) std::cout << "plot: " << s.out << "/dp.png\n";
}

}  // namespace demo
