// Ranks at the edges: a rank missing at start-up is named, a hung rank is told apart from a dead
// one, a rank resumed after the others failed exits with their reason.
//
// The ranks are started directly (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), not by the
// launcher: these cases stop and resume single ranks and need their pids.
#include "dist_fixture.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace ampactor::test::dist;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

constexpr int kTimeoutMs = 3000;

/// /proc/<pid>/stat's state letter ('T': stopped), or 0.
char state_of(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? 0 : stat[close + 2];
}

/// True if the process ignores SIGPIPE (/proc/<pid>/status's SigIgn mask).
bool ignores_sigpipe(pid_t pid) {
  const std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
  const auto at = status.find("SigIgn:");
  if (at == std::string::npos) return false;
  const unsigned long long mask = std::stoull(status.substr(at + 7), nullptr, 16);
  return (mask >> (SIGPIPE - 1)) & 1;
}

bool has(const std::string& line, const std::string& what) {
  return line.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("a rank that never starts is named, with the ranks that joined, within the timeout") {
  const fs::path dir = fresh("never-started");
  const int port = free_port();
  const auto start = clock_type::now();
  Rank r0(dir, 0, 3, port, {"--path", "actor", "--steps", "5"});
  Rank r1(dir, 1, 3, port, {"--path", "actor", "--steps", "5"});
  // Rank 2 never starts.
  CHECK(r0.wait(seconds(40)) == 1);
  CHECK(r1.wait(seconds(40)) == 1);
  // The timeout, plus the start-up of two LibTorch processes on a loaded machine.
  CHECK(clock_type::now() - start < milliseconds(kTimeoutMs) + seconds(12));
  for (Rank* r : {&r0, &r1}) {
    const std::string line = r->said();
    CAPTURE(line);
    CHECK(has(line, "ranks 0, 1 of 3 joined the store at 127.0.0.1:" + std::to_string(port) +
                        " within the 3000 ms timeout; rank 2 did not"));
  }
}

TEST_CASE(
    "a rank stopped past the timeout is called hung, not gone, and once resumed exits with "
    "the reason the others recorded") {
  const fs::path dir = fresh("stopped");
  const int port = free_port();
  const std::vector<std::string> args = {"--path", "actor", "--steps", "200", "--stop-at", "2:3"};
  Rank r0(dir, 0, 3, port, args), r1(dir, 1, 3, port, args), r2(dir, 2, 3, port, args);
  REQUIRE(poll([&] { return state_of(r2.pid()) == 'T'; }, seconds(40)) < seconds(40));
  // The others' collective times out, then ten heartbeats (1 s) show rank 2 silent.
  const auto noticed = poll([&] { return !r0.said().empty() && !r1.said().empty(); }, seconds(20));
  CHECK(noticed < milliseconds(kTimeoutMs) + seconds(4));
  const std::string hung = "rank 2 is hung (no heartbeat in 1000 ms): its process " +
                           std::to_string(r2.pid()) + " on this host is stopped";
  for (Rank* r : {&r0, &r1}) {
    const std::string line = r->said();
    CAPTURE(line);
    CHECK(has(line, hung));
    CHECK(!has(line, "gone"));
  }
  // Rank 0, the store's host, waits for a rank that is only stopped: resumed now, rank 2 can
  // still read why the others gave up.
  CHECK(r1.wait(seconds(10)) == 1);
  CHECK(r0.code() == -1);
  ::kill(r2.pid(), SIGCONT);
  CHECK(r2.wait(seconds(20)) == 1);
  CHECK(r0.wait(seconds(20)) == 1);
  const std::string line = r2.said();
  CAPTURE(line);
  CHECK(has(line, "rank 2: the gradient average failed: this rank was stopped or stalled for "));
  CHECK(has(line, "recorded: " + hung));
}

TEST_CASE(
    "rank 0, the store's host, stopped past the timeout and resumed exits with a message, "
    "not by SIGPIPE") {
  const fs::path dir = fresh("host-stopped");
  const int port = free_port();
  const std::vector<std::string> args = {"--path", "actor", "--steps", "200", "--stop-at", "0:3"};
  Rank r0(dir, 0, 2, port, args), r1(dir, 1, 2, port, args);
  REQUIRE(poll([&] { return state_of(r0.pid()) == 'T'; }, seconds(40)) < seconds(40));
  // Gloo's write to a closed connection raises SIGPIPE: the library has it ignored.
  CHECK(ignores_sigpipe(r0.pid()));
  // Rank 1 sees rank 0's process stopped without asking the store it hosts (which would wait
  // the timeout again): the collective's timeout and no more.
  const auto noticed = poll([&] { return !r1.said().empty(); }, seconds(20));
  CHECK(noticed < milliseconds(kTimeoutMs) + seconds(2));
  CHECK(r1.wait(seconds(20)) == 1);
  {
    const std::string line = r1.said();
    CAPTURE(line);
    CHECK(has(line, "rank 0 is hung: its process " + std::to_string(r0.pid()) +
                        " on this host is stopped (SIGSTOP or a debugger), so the store it hosts "
                        "cannot answer"));
  }
  ::kill(r0.pid(), SIGCONT);
  CHECK(r0.wait(seconds(20)) == 1);  // an exit code: 128 + 13 would be SIGPIPE
  const std::string line = r0.said();
  CAPTURE(line);
  CHECK(has(line, "rank 0: the gradient average failed: this rank was stopped or stalled for "));
  CHECK(has(line, "rank 1 is gone (heartbeat stopped): its process"));
}

TEST_CASE(
    "after a rank fails and rank 0 aborts with the store, the surviving rank names the rank that "
    "failed first") {
  const fs::path dir = fresh("first-failure");
  const int port = free_port();
  // Every rank aborts on its error, as an uncaught ScalerError does: rank 0's abort takes the
  // store it hosts.
  const std::vector<std::string> args = {"--path",     "pipeline", "--staleness",
                                         "0",          "--steps",  "30",
                                         "--throw-at", "1:3",      "--abort-on-failure"};
  Rank r0(dir, 0, 3, port, args), r1(dir, 1, 3, port, args), r2(dir, 2, 3, port, args);
  for (Rank* r : {&r0, &r1, &r2})
    CHECK(r->wait(seconds(40)) == 128 + SIGABRT);
  for (Rank* r : {&r0, &r2}) {
    const std::string line = r->said();
    CAPTURE(line);
    CHECK(has(line, "rank 1 failed: its step job in iteration 3 threw: an error in rank 1's step"));
  }
}
