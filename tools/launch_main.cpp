// ampactor-launch: runs N ranks of a program on this machine with torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits for them, and says
// how each one ended. It owns its ranks: each runs in a session (and process group) of its own
// with PR_SET_PDEATHSIG, so the kernel SIGKILLs it when the launcher dies, however it dies;
// SIGINT and SIGTERM are forwarded to every rank's group; and the ranks still running `--grace`
// seconds after the first failure or forwarded signal are SIGKILLed, so it never waits forever.
// Exit code: 0 when every rank exited with 0; else 128 + S for a signal S the launcher got before
// any rank failed; else the first failing rank's (its code, or 128 + S if signal S killed it);
// 2 for the launcher's own errors (options, a rank that cannot start).
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

// How long ranks SIGKILLed after the grace period may take to be reaped before the launcher
// stops waiting for them: a process in uninterruptible sleep (a driver, NFS) dies only when it
// leaves it, and the launcher must not wait forever for that either.
constexpr std::chrono::seconds kReapWait{10};

// The handler only counts and writes a byte to the self-pipe, which wakes the loop's poll().
volatile sig_atomic_t g_signal = 0;   // the last SIGINT or SIGTERM
volatile sig_atomic_t g_signals = 0;  // how many have come
int g_wake[2] = {-1, -1};
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};

void on_signal(int s) {
  const int saved = errno;
  if (s != SIGCHLD) g_signal = s, g_signals = g_signals + 1;
  const char byte = 0;
  (void)!::write(g_wake[1], &byte, 1);  // non-blocking: a full pipe wakes the loop already
  errno = saved;
}

sigset_t handled() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled)
    sigaddset(&set, s);
  return set;
}

void install_handlers() {
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(std::string("cannot make a pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_mask = handled();
  sa.sa_flags = SA_RESTART;  // no SA_NOCLDSTOP: a rank that stops is worth a line
  for (int s : kHandled)
    ::sigaction(s, &sa, nullptr);
}

std::string signal_name(int s) {
  std::string n = std::to_string(s);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
  if (const char* abbrev = ::sigabbrev_np(s)) n += std::string(" (SIG") + abbrev + ")";
#endif
  return n;
}

std::string seconds(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

/// A port free on this machine now (the kernel's choice), for --master-port 0.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  ::close(fd);
  return ntohs(a.sin_port);
}

/// One line on stderr in one write, so that it never interleaves with the ranks' own lines.
void say(const std::string& what) {
  const std::string line = "ampactor-launch: " + what + "\n";
  std::fputs(line.c_str(), stderr);
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool ended = false;
  bool stopped = false;  // as last seen: stopped by a signal and not continued
  bool killed = false;   // SIGKILLed by the launcher after the grace period
  int status = 0;        // waitpid's, once ended
};

/// How a rank that ended did, as its line says it.
std::string outcome(const Rank& r, double grace) {
  const std::string who = "rank " + std::to_string(r.rank);
  if (WIFEXITED(r.status))
    return who + (WEXITSTATUS(r.status) == 0
                      ? " succeeded"
                      : " exited with code " + std::to_string(WEXITSTATUS(r.status)));
  if (r.killed && WTERMSIG(r.status) == SIGKILL)
    return who + " was killed by the launcher after the grace period (" + seconds(grace) +
           (r.stopped ? "; it was stopped)" : ")");
  return who + " was killed by signal " + signal_name(WTERMSIG(r.status));
}

/// `s` to the rank's process group (its own children too), or to the rank alone while it has no
/// group yet (before its setsid).
void signal_rank(const Rank& r, int s) {
  if (::kill(-r.pid, s) != 0) ::kill(r.pid, s);
}

/// Starts `cmd` as a rank the launcher owns. Called with kHandled blocked, so that no signal runs
/// the launcher's handler in the child; `mask` is the mask the child gets back before its exec.
pid_t spawn(const std::vector<std::string>& cmd, const std::map<std::string, std::string>& set,
            const sigset_t& mask) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    if (!set.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (const auto& [k, v] : set)
    env.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const std::string& a : cmd)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int err[2];  // the exec's errno, if it fails; closed by a successful exec
  if (::pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("cannot make a pipe: ") + std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only, until the exec
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : kHandled)
      ::sigaction(s, &dfl, nullptr);
    ::setsid();  // a group of its own: signals reach its children too
    // Dies with the launcher, even a SIGKILLed one (the signal follows the forking thread, and
    // the launcher has only one).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // the launcher died before the prctl
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    (void)!::write(err[1], &e, sizeof e);
    ::_exit(127);
  }
  if (pid < 0) {
    const int e = errno;
    ::close(err[0]), ::close(err[1]);
    throw std::runtime_error("cannot start " + cmd[0] + ": " + std::strerror(e));
  }
  ::close(err[1]);
  int e = 0;
  ssize_t n;
  while ((n = ::read(err[0], &e, sizeof e)) < 0 && errno == EINTR) {
  }
  ::close(err[0]);
  if (n == sizeof e) {  // the exec failed
    ::waitpid(pid, nullptr, 0);
    throw std::runtime_error("cannot start " + cmd[0] + ": " + std::strerror(e));
  }
  return pid;
}

/// Wakes when the handler writes to the self-pipe (a forwarded signal or a rank's SIGCHLD) or
/// after `timeout_ms` (-1: no deadline), then empties the pipe so that the next poll() waits.
void wait_for_wake(int timeout_ms) {
  pollfd wake{g_wake[0], POLLIN, 0};
  ::poll(&wake, 1, timeout_ms);
  char drain[64];
  while (::read(g_wake[0], drain, sizeof drain) > 0) {
  }
}

/// What supervise() keeps between its wake-ups: the ranks, the exit code so far and why, and the
/// deadlines. A struct with one member function per step, so that each step reads on its own.
struct Supervision {
  std::vector<Rank>& ranks;
  double grace;
  Clock::duration grace_d;
  int code = 0;
  std::string why;  // what gave the exit code
  bool failed = false;
  int signals = 0;  // of g_signals, those handled
  std::optional<Clock::time_point> kill_at, give_up_at;

  Supervision(std::vector<Rank>& r, double g)
      : ranks(r),
        grace(g),
        grace_d(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(std::min(g, 1e9)))) {}  // no overflow of the clock

  auto running() const {
    return std::count_if(ranks.begin(), ranks.end(), [](const Rank& r) { return !r.ended; });
  }

  /// The run has failed: the first failure gives the exit code and starts the grace period.
  void fail(int c, const std::string& reason) {
    if (code == 0) code = c, why = reason;
    if (!kill_at) kill_at = Clock::now() + grace_d;
    if (failed) return;
    failed = true;
    for (const Rank& r : ranks)  // those that succeeded before, so that each rank has its line
      if (r.ended) say(outcome(r, grace));
  }

  /// Takes the ranks' changes of state waiting now, without blocking: the loop has signals and
  /// deadlines to watch too.
  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
      const auto r = std::find_if(ranks.begin(), ranks.end(),
                                  [&](const Rank& x) { return x.pid == pid && !x.ended; });
      if (r == ranks.end()) continue;
      const std::string who = "rank " + std::to_string(r->rank);
      if (WIFSTOPPED(status)) {
        r->stopped = true;
        say(who + " is stopped by signal " + signal_name(WSTOPSIG(status)));
        continue;
      }
      if (WIFCONTINUED(status)) {
        r->stopped = false;
        say(who + " continues");
        continue;
      }
      r->status = status;
      const int c = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (c != 0) fail(c, outcome(*r, grace) + " first");
      r->ended = true;
      if (failed) say(outcome(*r, grace));
    }
  }

  /// The signals come since the last look: the first is forwarded to every rank's group and
  /// starts the grace period; a second one ends the grace at once.
  void take_signals(Clock::time_point now) {
    if (g_signals == signals) return;
    if (signals == 0) {
      forward_signal(g_signal, now);
    } else if (!give_up_at) {
      kill_at = now;  // a second signal: no more grace
    }
    signals = g_signals;
  }

  /// The first signal S: the run fails with 128 + S, S goes to every running rank's group, and
  /// those left get the grace from now at most.
  void forward_signal(int s, Clock::time_point now) {
    fail(128 + s, "signal " + signal_name(s) + " to the launcher");
    kill_at = std::min(*kill_at, now + grace_d);
    for (const Rank& r : ranks)
      if (!r.ended) signal_rank(r, s);
    say("signal " + signal_name(s) + " forwarded to the " + std::to_string(running()) +
        " ranks still running; SIGKILL to those left in " + seconds(grace));
  }

  /// The grace is over: SIGKILL to the ranks still running, and kReapWait for their reaping.
  void kill_the_rest(Clock::time_point now) {
    for (Rank& r : ranks)
      if (!r.ended) signal_rank(r, SIGKILL), r.killed = true;
    give_up_at = now + kReapWait;
  }

  void say_left_behind() const {
    for (const Rank& r : ranks)
      if (!r.ended)
        say("rank " + std::to_string(r.rank) + " has not ended " +
            seconds(double(kReapWait.count())) + " after the launcher's SIGKILL; left behind");
  }

  /// poll()'s timeout: until the next deadline (the give-up once the ranks were killed, else the
  /// end of the grace), or none (-1) while nothing has failed.
  int timeout_ms(Clock::time_point now) const {
    const auto next = give_up_at ? give_up_at : kill_at;
    if (!next) return -1;
    return std::max(0, int(std::chrono::ceil<std::chrono::milliseconds>(*next - now).count()));
  }
};

/// Waits for the ranks and returns the exit code. Once the run has failed (a rank did, or a
/// signal came) every rank's end is said; those still running `grace` seconds later are killed.
int supervise(std::vector<Rank>& ranks, double grace) {
  Supervision s(ranks, grace);
  while (s.running() > 0) {
    s.reap();
    if (s.running() == 0) break;
    const auto now = Clock::now();
    s.take_signals(now);
    if (s.kill_at && now >= *s.kill_at && !s.give_up_at) {
      s.kill_the_rest(now);
      continue;
    }
    if (s.give_up_at && now >= *s.give_up_at) {
      s.say_left_behind();
      break;
    }
    wait_for_wake(s.timeout_ms(now));
  }
  if (s.code != 0) say("exit code " + std::to_string(s.code) + ": " + s.why);
  return s.code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-launch: N local ranks of a data-parallel program (torchrun's variables)"};
  int nproc = 1, nnodes = 1, node_rank = 0, port = 29500;
  double grace = 30;
  std::string addr = "127.0.0.1";
  std::vector<std::string> cmd;
  app.add_option("--nproc", nproc, "ranks on this machine")->check(CLI::Range(1, 1024));
  app.add_option("--nnodes", nnodes, "machines in the run")->check(CLI::Range(1, 1 << 16));
  app.add_option("--node-rank", node_rank, "this machine's index (0 hosts the store)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", addr, "the address of node 0 (MASTER_ADDR)");
  app.add_option("--master-port", port, "the store's port on node 0 (MASTER_PORT; 0: a free one)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--grace", grace,
                 "seconds the ranks get after a rank fails or SIGINT/SIGTERM is forwarded, "
                 "before SIGKILL")
      ->check(CLI::NonNegativeNumber);
  app.add_option("command", cmd, "the program and its arguments (after --)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad option is the launcher's error: 2
  }
  if (node_rank >= nnodes) {
    say("--node-rank " + std::to_string(node_rank) + " must be below --nnodes " +
        std::to_string(nnodes));
    return 2;
  }
  std::vector<Rank> ranks;
  try {
    if (port == 0) {
      if (nnodes > 1) throw std::runtime_error("--master-port 0 needs --nnodes 1");
      port = free_port();
    }
    install_handlers();
    // Blocked while the ranks start: a signal meanwhile is handled once they all run.
    sigset_t block = handled(), mask;
    ::sigprocmask(SIG_BLOCK, &block, &mask);
    for (int l = 0; l < nproc; ++l) {
      const int rank = node_rank * nproc + l;
      ranks.push_back({rank, spawn(cmd,
                                   {{"RANK", std::to_string(rank)},
                                    {"WORLD_SIZE", std::to_string(nproc * nnodes)},
                                    {"LOCAL_RANK", std::to_string(l)},
                                    {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                    {"MASTER_ADDR", addr},
                                    {"MASTER_PORT", std::to_string(port)}},
                                   mask)});
    }
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    return supervise(ranks, grace);
  } catch (const std::exception& e) {
    say(e.what());
    for (const Rank& r : ranks) {  // the ranks started before a later one could not
      signal_rank(r, SIGKILL);
      say("rank " + std::to_string(r.rank) + " was killed by the launcher (a rank cannot start)");
    }
    return 2;
  }
}
