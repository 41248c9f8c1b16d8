// ampactor-launch owning its ranks: they die with it, signals are forwarded and followed by
// SIGKILL after a grace period, and its exit status says what happened to each rank.
#include "dist_fixture.h"

#include <signal.h>

#include <cerrno>
#include <thread>

using namespace ampactor::test::dist;
using ampactor::test::Child;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

namespace {

/// The launcher over `n` ranks of `sh -c`, each recording its pid and the launcher's (its
/// $PPID) in DIR/pid.RANK before it runs `body`.
std::vector<std::string> ranks_of(int n, const char* grace, const fs::path& dir,
                                  const std::string& body) {
  return {AMPACTOR_LAUNCH,
          "--nproc",
          std::to_string(n),
          "--grace",
          grace,
          "--",
          "sh",
          "-c",
          "echo $$ $PPID > " + dir.string() + "/pid.$RANK; " + body};
}

/// A process's state letter in /proc (R, S, T, Z...), or 0 if it does not exist.
char state(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto at = stat.rfind(") ");
  return at == std::string::npos ? 0 : stat[at + 2];
}

/// Gone: no such process, or a zombie (its new parent may be slow to reap it).
bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const char s = state(pid);
  return s == 0 || s == 'Z' || s == 'X';
}

template <class F>
bool within(std::chrono::milliseconds limit, F&& f) {
  const auto end = Clock::now() + limit;
  while (!f()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// The ranks' pids and the launcher's, read from their files; SIGKILLs any rank left over (an
/// orphan before the launcher owned its ranks) when the test ends.
struct Ranks {
  std::vector<pid_t> pids;
  pid_t launcher = -1;

  Ranks(const fs::path& dir, int n) {
    const bool all = within(seconds(20), [&] {
      pids.clear();
      for (int r = 0; r < n; ++r) {
        std::istringstream in(slurp(dir / ("pid." + std::to_string(r))));
        pid_t pid = -1, parent = -1;
        if (!(in >> pid >> parent)) return false;
        pids.push_back(pid);
        launcher = parent;
      }
      return true;
    });
    REQUIRE_MESSAGE(all, "the ranks did not start");
  }
  ~Ranks() {
    for (pid_t p : pids)
      if (!gone(p)) ::kill(p, SIGCONT), ::kill(p, SIGKILL);
  }
  bool all_gone(std::chrono::milliseconds limit) const {
    return within(limit, [&] { return std::all_of(pids.begin(), pids.end(), gone); });
  }
};

int lines_of(const std::string& log, const std::string& prefix) {
  int n = 0;
  for (auto at = log.find(prefix); at != std::string::npos; at = log.find(prefix, at + 1))
    ++n;
  return n;
}

}  // namespace

TEST_CASE("ampactor-launch SIGKILLed: its ranks die with it within seconds") {
  const fs::path dir = fresh("launch-sigkill");
  Child launcher(ranks_of(3, "2", dir, "exec sleep 60"), (dir / "log.txt").string());
  const Ranks ranks(dir, 3);
  REQUIRE(launcher.kill());
  CHECK_MESSAGE(ranks.all_gone(seconds(5)), "ranks orphaned by a SIGKILLed launcher");
}

TEST_CASE("ampactor-launch SIGTERMed with a rank stopped: forwarded then SIGKILL after --grace") {
  const fs::path dir = fresh("launch-sigterm");
  Child launcher(ranks_of(3, "2", dir, "exec sleep 60"), (dir / "log.txt").string());
  const Ranks ranks(dir, 3);
  ::kill(ranks.pids[1], SIGSTOP);
  REQUIRE(within(seconds(5), [&] { return state(ranks.pids[1]) == 'T'; }));
  const auto start = Clock::now();
  ::kill(ranks.launcher, SIGTERM);
  const int code = launcher.wait(seconds(10));
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string log = slurp(dir / "log.txt");
  CAPTURE(log);
  CHECK(code == 128 + SIGTERM);
  CHECK(took >= 1.9);  // the grace is given
  CHECK(took < 2 + 3);
  CHECK(ranks.all_gone(seconds(2)));
  CHECK(log.find("rank 1 is stopped by signal 19") != std::string::npos);
  CHECK(log.find("rank 0 was killed by signal 15 (SIGTERM)") != std::string::npos);
  CHECK(log.find("rank 2 was killed by signal 15 (SIGTERM)") != std::string::npos);
  CHECK(
      log.find("rank 1 was killed by the launcher after the grace period (2 s; it was stopped)") !=
      std::string::npos);
  CHECK(log.find("exit code 143: signal 15 (SIGTERM) to the launcher") != std::string::npos);
}

TEST_CASE("ampactor-launch SIGINTed: forwarded to every rank and one that ignores it is killed") {
  const fs::path dir = fresh("launch-sigint");
  Child launcher(ranks_of(2, "2", dir,
                          "case $RANK in 0) trap 'echo rank 0 got SIGINT; exit 7' INT; "
                          "while :; do sleep 0.1; done;; *) trap '' INT; exec sleep 60;; esac"),
                 (dir / "log.txt").string());
  const Ranks ranks(dir, 2);
  ::kill(ranks.launcher, SIGINT);
  const int code = launcher.wait(seconds(10));
  const std::string log = slurp(dir / "log.txt");
  CAPTURE(log);
  CHECK(code == 128 + SIGINT);
  CHECK(ranks.all_gone(seconds(2)));
  CHECK(log.find("rank 0 got SIGINT") != std::string::npos);
  CHECK(log.find("ampactor-launch: rank 0 exited with code 7") != std::string::npos);
  CHECK(log.find("rank 1 was killed by the launcher after the grace period (2 s)") !=
        std::string::npos);
}

TEST_CASE("ampactor-launch: a second SIGTERM ends the grace at once") {
  const fs::path dir = fresh("launch-twice");
  Child launcher(ranks_of(2, "60", dir, "trap '' TERM; exec sleep 60"), (dir / "log.txt").string());
  const Ranks ranks(dir, 2);
  ::kill(ranks.launcher, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(ranks.launcher, SIGTERM);
  CHECK(launcher.wait(seconds(5)) == 128 + SIGTERM);
  CHECK(ranks.all_gone(seconds(2)));
}

TEST_CASE("ampactor-launch: a line per rank on how it ended and the first failing rank's code") {
  const fs::path dir = fresh("launch-lines");
  Child launcher(ranks_of(4, "2", dir,
                          "case $RANK in 0) exit 0;; 1) sleep 1; exit 3;; 2) kill -9 $$;; "
                          "*) exec sleep 60;; esac"),
                 (dir / "log.txt").string());
  const Ranks ranks(dir, 4);
  const int code = launcher.wait(seconds(10));
  const std::string log = slurp(dir / "log.txt");
  CAPTURE(log);
  CHECK(code == 128 + SIGKILL);  // rank 2's: it failed first
  for (int r = 0; r < 4; ++r)
    CHECK(lines_of(log, "ampactor-launch: rank " + std::to_string(r) + " ") == 1);
  CHECK(log.find("ampactor-launch: rank 0 succeeded") != std::string::npos);
  CHECK(log.find("ampactor-launch: rank 1 exited with code 3") != std::string::npos);
  CHECK(log.find("ampactor-launch: rank 2 was killed by signal 9 (SIGKILL)") != std::string::npos);
  CHECK(log.find("ampactor-launch: rank 3 was killed by the launcher after the grace period") !=
        std::string::npos);
  CHECK(log.find("ampactor-launch: exit code 137: rank 2 was killed by signal 9 (SIGKILL) first") !=
        std::string::npos);
  CHECK(ranks.all_gone(seconds(2)));
}
