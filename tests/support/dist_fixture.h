// Running ranks of ampactor-dist-worker under ampactor-launch from a test: a fresh folder per
// run, the ranks' outputs and the launcher's log, and what each rank wrote.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

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

/// A worker's arguments as one line, for CAPTURE.
inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v)
    s += a + " ";
  return s;
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

/// The workers' DistOptions::timeout where a test starts them by hand (Rank).
constexpr int kRankTimeoutMs = 3000;

/// A port nobody listens on now (the kernel's pick for a socket bound to port 0).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Rank `rank` of `n` of ampactor-dist-worker, started without the launcher (RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT set here), its output in DIR/log<rank>.txt.
class Rank {
 public:
  /// `env`: more variables, or these replaced.
  Rank(const fs::path& dir, int rank, int n, int port, std::vector<std::string> args,
       std::vector<std::string> env = {})
      : log_(dir / ("log" + std::to_string(rank) + ".txt")),
        child_(argv_of(dir, args), log_, with(rank, n, port, std::move(env))) {}
  pid_t pid() const { return child_.pid(); }
  /// Its exit code, 128 + the signal that killed it, or -1 while it runs.
  int code() { return child_.code(); }
  /// Waits up to `limit` for it to exit; its code, or -1.
  int wait(std::chrono::milliseconds limit) { return child_.wait(limit); }
  /// The worker's error line ("" before it says anything).
  std::string said() const {
    const std::string s = slurp(log_);
    // LibTorch's own warnings (glog's) may come first.
    const auto at = s.find("ampactor-dist-worker rank ");
    const std::string from = at == std::string::npos ? s : s.substr(at);
    return from.substr(0, from.find('\n'));
  }

 private:
  static std::vector<std::string> with(int rank, int n, int port, std::vector<std::string> env) {
    for (std::string v :
         {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(n),
          "LOCAL_RANK=" + std::to_string(rank), std::string("MASTER_ADDR=127.0.0.1"),
          "MASTER_PORT=" + std::to_string(port)}) {
      const std::string name = v.substr(0, v.find('=') + 1);
      if (std::none_of(env.begin(), env.end(),
                       [&](const std::string& e) { return e.rfind(name, 0) == 0; }))
        env.push_back(v);
    }
    return env;
  }
  static std::vector<std::string> argv_of(const fs::path& dir,
                                          const std::vector<std::string>& args) {
    std::vector<std::string> argv = {AMPACTOR_DIST_WORKER, "--out", dir.string(), "--timeout-ms",
                                     std::to_string(kRankTimeoutMs)};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  std::string log_;
  ampactor::test::Child child_;
};

/// Polls `done` every 5 ms for up to `limit`; the time it took, or `limit` if it never held.
template <class F>
std::chrono::steady_clock::duration poll(F&& done, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (!done() && std::chrono::steady_clock::now() - start < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return std::chrono::steady_clock::now() - start;
}

#ifdef AMPACTOR_CKPT
/// ampactor-ckpt with `args`, as a user runs it: its exit code and what it wrote (at most 120 s).
inline std::pair<int, std::string> ckpt_tool(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {AMPACTOR_CKPT};
  argv.insert(argv.end(), args.begin(), args.end());
  const fs::path log = fresh("ckpt-tool") / "log.txt";
  int code = -1;
  {
    ampactor::test::Child c(argv, log.string());
    code = c.wait(std::chrono::seconds(120));
  }
  return {code, slurp(log)};
}
#endif

}  // namespace ampactor::test::dist
