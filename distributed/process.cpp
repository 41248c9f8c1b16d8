// The process behind a rank: written into the store when the rank joins, so that a rank on the
// same host can tell a stopped or hung one (still there) from a dead one (exited); and the
// environment and host name it reads.
#include "watch.h"

#include <c10/util/Exception.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ampactor::dist::detail {

std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string string_of(const std::vector<std::uint8_t>& b) {
  return {b.begin(), b.end()};
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "";
}

std::string brief(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

void ignore_sigpipe() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
      old.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
}

namespace {

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

/// /proc/<pid>/stat's state letter and start time; false if there is no such process.
bool stat_of(long pid, char& state, unsigned long long& started) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  // The command name, in parentheses, may hold spaces and parentheses: fields follow the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> state;
  for (int i = 4; i < 22 && rest >> field; ++i) {
  }
  return bool(rest >> started);
}

}  // namespace

Place Place::here() {
  Place p;
  p.pid = long(::getpid());
  char state = 0;
  stat_of(p.pid, state, p.started);
  const std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  // Without both, no other rank can be sure a pid means this process: it will not check.
  if (!boot.empty() && n > 0) p.host = boot + "/" + std::string(ns, std::size_t(n));
  p.host_name = detail::host_name();
  return p;
}

std::string Place::text() const {
  return std::to_string(pid) + " " + std::to_string(started) + " " + (host.empty() ? "-" : host) +
         " " + (host_name.empty() ? "-" : host_name);
}

Place Place::parse(const std::string& text) {
  Place p;
  std::istringstream in(text);
  in >> p.pid >> p.started >> p.host >> p.host_name;
  if (p.host == "-") p.host.clear();
  if (p.host_name == "-") p.host_name.clear();
  return p;
}

Place::State Place::state() const {
  static const std::string mine = here().host;
  if (pid <= 0 || host.empty() || host != mine) return State::unknown;
  char s = 0;
  unsigned long long at = 0;
  if (!stat_of(pid, s, at)) {
    // No /proc entry: gone, if /proc can be read at all.
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return State::exited;
    return State::unknown;
  }
  if (at != started || s == 'Z' || s == 'X') return State::exited;  // a zombie, or a reused pid
  if (s == 'T' || s == 't') return State::stopped;
  return State::running;
}

std::string Place::said(State s) const {
  // Another host name on this kernel (a container, a network namespace): said as such.
  static const std::string my_name = here().host_name;
  const std::string its = "its process " + std::to_string(pid) +
                          (host_name.empty() || host_name == my_name
                               ? " on this host "
                               : " on " + host_name + " (this machine's kernel) ");
  switch (s) {
    case State::exited:
      return its + "has exited";
    case State::stopped:
      return its + "is stopped (SIGSTOP or a debugger)";
    case State::running:
      return its + "is still running";
    case State::unknown:
      break;
  }
  return "it runs on " + (host_name.empty() ? std::string("another host") : host_name) +
         ", where its process cannot be checked from here";
}

}  // namespace ampactor::dist::detail
