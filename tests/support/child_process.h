// A child process for the tests that kill or watch one: its output in a file, waited for with a
// timeout, killed with SIGKILL when the test is done with it.
#pragma once

#include "doctest_torch.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ampactor::test {

/// A child running `argv` with its output in `out`, in this process's environment with `env`'s
/// "NAME=value" entries put in place of the same names, and SIGPIPE at its default (as a shell
/// leaves it, even under a runner that ignores it).
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& out, std::vector<std::string> env = {}) {
    for (char** e = environ; *e; ++e) {
      const std::string var = *e;
      bool replaced = false;
      for (const std::string& mine : env)
        replaced = replaced || var.compare(0, var.find('=') + 1, mine, 0, mine.find('=') + 1) == 0;
      if (!replaced) env.push_back(var);
    }
    std::vector<char*> args, vars;
    for (std::string& a : argv)
      args.push_back(a.data());
    args.push_back(nullptr);
    for (std::string& v : env)
      vars.push_back(v.data());
    vars.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t dfl;
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &dfl);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    const int rc = posix_spawn(&pid_, args[0], &fa, &attr, args.data(), vars.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE_MESSAGE(rc == 0, "cannot start " << argv[0]);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) ::kill(pid_, SIGKILL), ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  /// Its exit code, 128 + the signal that killed it, or -1 while it runs (reaped once exited).
  int code() {
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return code_;
  }
  /// Waits up to `limit`; the exit status, or -1 if it is still running (then killed).
  int wait(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (code() < 0 && pid_ > 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return code();  // -1: the destructor kills it
  }
  /// True while it runs; an exited one is reaped.
  bool running() { return code() < 0 && pid_ > 0; }
  /// SIGKILL now; true if it was still running.
  bool kill() {
    if (!running()) return false;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return true;
  }

 private:
  pid_t pid_ = -1;
  int code_ = -1;
};

}  // namespace ampactor::test
