// ampactor-launch: runs N ranks of a program on this machine with torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits for them, and says
// which rank failed. A failed rank's peers fail by themselves within their own timeout; those
// still running `--grace` seconds after the first failure are killed.
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) {
  g_signal = s;
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

pid_t spawn(const std::vector<std::string>& cmd, const std::map<std::string, std::string>& set) {
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
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) throw std::runtime_error("cannot start " + cmd[0] + ": " + std::strerror(rc));
  return pid;
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
  app.add_option("--grace", grace, "seconds the other ranks get after a rank fails")
      ->check(CLI::NonNegativeNumber);
  app.add_option("command", cmd, "the program and its arguments (after --)")->required();
  CLI11_PARSE(app, argc, argv);
  if (node_rank >= nnodes) {
    std::cerr << "ampactor-launch: --node-rank " << node_rank << " must be below --nnodes "
              << nnodes << "\n";
    return 2;
  }
  try {
    if (port == 0) {
      if (nnodes > 1) throw std::runtime_error("--master-port 0 needs --nnodes 1");
      port = free_port();
    }
    ::signal(SIGINT, on_signal);
    ::signal(SIGTERM, on_signal);
    std::map<pid_t, int> running;  // pid -> rank
    for (int l = 0; l < nproc; ++l) {
      const int rank = node_rank * nproc + l;
      running[spawn(cmd, {{"RANK", std::to_string(rank)},
                          {"WORLD_SIZE", std::to_string(nproc * nnodes)},
                          {"LOCAL_RANK", std::to_string(l)},
                          {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                          {"MASTER_ADDR", addr},
                          {"MASTER_PORT", std::to_string(port)}})] = rank;
    }
    int result = 0;
    std::chrono::steady_clock::time_point deadline{};
    bool killed = false;
    while (!running.empty()) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0 && running.count(pid)) {
        const int rank = running[pid];
        running.erase(pid);
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0) {
          say("rank " + std::to_string(rank) +
              (WIFEXITED(status) ? " exited with code " + std::to_string(code)
                                 : " was killed by signal " + std::to_string(WTERMSIG(status))));
          if (result == 0) {
            result = code;
            deadline = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(std::int64_t(grace * 1000));
          }
        }
        continue;
      }
      const bool expired = result != 0 && std::chrono::steady_clock::now() > deadline;
      if ((g_signal || expired) && !killed) {
        for (const auto& [p, rank] : running) {
          say("stopping rank " + std::to_string(rank) +
              (g_signal ? " (interrupted)" : " (still running after the grace)"));
          ::kill(p, g_signal ? g_signal : SIGKILL);
        }
        killed = true;
        if (result == 0) result = 128 + g_signal;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return result;
  } catch (const std::exception& e) {
    std::cerr << "ampactor-launch: " << e.what() << "\n";
    return 2;
  }
}
