// Running ranks of ampactor-dist-worker under ampactor-launch from a test: a fresh folder per
// run, the ranks' outputs and the launcher's log, and what each rank wrote.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "child_process.h"
#include "remove_tree.h"

namespace ampactor::test::dist {

namespace fs = std::filesystem;

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A fresh folder per run (emptied by remove_tree: see there why).
inline fs::path fresh(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("ampactor-dist-" + std::to_string(::getpid())) / name;
  remove_tree(d.string());
  fs::create_directories(d);
  return d;
}

struct Run {
  int code = -1;
  std::chrono::steady_clock::duration elapsed{};  // from the launch to the last process's exit
  std::string log;
  std::vector<std::string> ranks;  // each rank's output file
};

/// `n` ranks (0: one process, --single over `single` shards) with the worker's `args`.
inline Run launch(const std::string& name, int n, std::vector<std::string> args, int single = 0,
                  std::chrono::seconds limit = std::chrono::seconds(120)) {
  const fs::path dir = fresh(name);
  std::vector<std::string> argv;
  if (n > 0)
    argv = {AMPACTOR_LAUNCH,
            "--nproc",
            std::to_string(n),
            "--master-port",
            "0",
            "--grace",
            "60",
            "--",
            AMPACTOR_DIST_WORKER};
  else
    argv = {AMPACTOR_DIST_WORKER, "--single", std::to_string(single)};
  argv.insert(argv.end(), {"--out", dir.string()});
  argv.insert(argv.end(), args.begin(), args.end());
  Run r;
  {
    const auto start = std::chrono::steady_clock::now();
    ampactor::test::Child c(argv, (dir / "log.txt").string());
    r.code = c.wait(limit);
    r.elapsed = std::chrono::steady_clock::now() - start;
  }
  r.log = slurp(dir / "log.txt");
  for (int i = 0; i < std::max(n, 1); ++i)
    r.ranks.push_back(slurp(dir / ("rank" + std::to_string(i) + ".txt")));
  return r;
}

/// The (scale, found_inf) lines of a rank's output.
inline std::vector<std::pair<double, int>> trajectory(const std::string& out) {
  std::vector<std::pair<double, int>> t;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string first;
    l >> first;
    if (first == "param" || first == "done" || first == "overlap_bytes") continue;
    double scale = 0;
    int inf = 0;
    l >> scale >> inf;
    t.emplace_back(scale, inf);
  }
  return t;
}

/// The line rank `rank` of the worker wrote to stderr (its error), or "" if it wrote none.
inline std::string said_by(const std::string& log, int rank) {
  const std::string said = "ampactor-dist-worker rank " + std::to_string(rank) + ": ";
  const auto at = log.find(said);
  return at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
}

}  // namespace ampactor::test::dist
