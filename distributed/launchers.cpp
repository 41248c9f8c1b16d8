// What each launcher tells a rank: torchrun's variables, Open MPI's, PMI's and Slurm's, read in
// one documented order (dist.h), and torchrun's error file for a rank that fails.
#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include "watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>

namespace ampactor::dist {
namespace {

using detail::env;

/// An integer variable in [lo, hi]; `fallback` when unset.
int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw ScalerError(errc::bad_option, std::string("ampactor::dist: ") + name + "=" + v +
                                            " is not an integer in [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + "]");
  return int(x);
}

/// One launcher's names for the rank, the world size and the local rank.
struct Form {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// The order of dist.h: torchrun's (which ampactor-launch sets too) first, so that a launcher
// started inside another (torchrun in a Slurm step) is read as the innermost one.
const Form kForms[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"PMI", "PMIX_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

std::string looked_for() {
  std::string s;
  for (const Form& f : kForms)
    s += std::string(s.empty() ? "" : "; ") + f.launcher + ": " + f.rank + " and " + f.size;
  return s + " (with SLURM_STEP_ID: inside srun)";
}

/// Node `node`'s task count in Slurm's compressed tasks-per-node list ("2(x3),1"); 0 when the
/// list cannot be read or is shorter.
int slurm_tasks_on(const std::string& list, int node) {
  int first = 0;
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    int count = 0, times = 1;
    if (std::sscanf(list.substr(at, end - at).c_str(), "%d(x%d)", &count, &times) < 1 ||
        count < 1 || times < 1)
      return 0;
    if (node < first + times) return count;
    first += times;
    at = end + 1;
  }
  return 0;
}

bool in_slurm_step() {
  return env("SLURM_STEP_ID") || env("SLURM_STEPID");
}

/// The first form whose rank and size are set, in dist.h's order; else throws, naming what is
/// missing.
const Form& form_from_env() {
  for (const Form& f : kForms) {
    if (!env(f.rank) || !env(f.size)) continue;
    if (std::string(f.launcher) == "Slurm" && !in_slurm_step()) continue;
    return f;
  }
  // A half-set form is a mistake worth naming before the list of every form.
  for (const Form& f : kForms)
    if (bool(env(f.rank)) != bool(env(f.size)))
      throw ScalerError(errc::bad_option, std::string("ampactor::dist: ") +
                                              (env(f.rank) ? f.rank : f.size) + " is set but " +
                                              (env(f.rank) ? f.size : f.rank) + " is not");
  throw ScalerError(errc::bad_option,
                    "ampactor::dist: no launcher's variables are set; looked for " + looked_for() +
                        ". Launch with ampactor-launch, torchrun, mpirun or srun, or set RANK "
                        "and WORLD_SIZE");
}

/// Slurm's local size, which it does not set: this node's count in its tasks-per-node list; a
/// one-node step has all.
void read_slurm_local_size(Launch& l) {
  const int max = std::numeric_limits<int>::max();
  const char* tasks = env("SLURM_STEP_TASKS_PER_NODE") ? env("SLURM_STEP_TASKS_PER_NODE")
                                                       : env("SLURM_TASKS_PER_NODE");
  if (tasks && env("SLURM_NODEID"))
    l.local_world_size = slurm_tasks_on(tasks, env_int("SLURM_NODEID", 0, max, 0));
  const char* nodes = env("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  if (env_int(nodes, 1, max, 0) == 1) l.local_world_size = l.world_size;
}

/// torchrun's own variables: whether its agent hosts the store, the restart and the run id.
void read_torchrun(Launch& l) {
  l.launcher = "torchrun";
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  l.agent_store = agent && (std::string(agent) == "True" || std::string(agent) == "1");
  l.restart = env_int("TORCHELASTIC_RESTART_COUNT", 0, std::numeric_limits<int>::max(), 0);
  l.run_id = env("TORCHELASTIC_RUN_ID");
}

/// Where rank 0 runs: MASTER_ADDR, else Slurm's first host, else the default (127.0.0.1); refused
/// where Open MPI or PMI, which do not say it, started ranks on other hosts too.
void read_master_addr(Launch& l) {
  if (const char* a = env("MASTER_ADDR"))
    l.master_addr = a;
  else if (l.launcher == "Slurm") {
    const char* list =
        env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_NODELIST");
    if (list) l.master_addr = first_slurm_host(list);
  } else if ((l.launcher == "Open MPI" || l.launcher == "PMI") && l.local_world_size &&
             l.local_world_size < l.world_size) {
    // Neither says where rank 0 runs: 127.0.0.1 would leave the other hosts' ranks waiting
    // out their timeout on a store that is not there.
    throw ScalerError(errc::bad_option,
                      "ampactor::dist: " + l.launcher + " started " + std::to_string(l.world_size) +
                          " ranks, " + std::to_string(l.local_world_size) +
                          " of them on this host, and MASTER_ADDR is not set: name rank 0's "
                          "host (mpirun -x MASTER_ADDR=<host>)");
  }
}

/// MASTER_PORT, else the default, or under Slurm a port per job, so that two jobs sharing a node
/// do not meet on one.
int master_port_from_env(const Launch& l) {
  int port = l.master_port;
  if (l.launcher == "Slurm" && env("SLURM_JOB_ID"))
    port = 15000 + env_int("SLURM_JOB_ID", 0, std::numeric_limits<int>::max(), 0) % 20000;
  return env_int("MASTER_PORT", 1, 65535, port);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const auto bad = [&](const char* why) {
    return ScalerError(errc::bad_option,
                       "ampactor::dist: the Slurm host list '" + nodelist + "' " + why);
  };
  // The first host ends at the first comma outside brackets.
  const auto open = nodelist.find('['), comma = nodelist.find(',');
  if (open == std::string::npos || (comma != std::string::npos && comma < open)) {
    const std::string h = nodelist.substr(0, comma);
    if (h.empty()) throw bad("names no host");
    return h;
  }
  const auto close = nodelist.find(']', open);
  if (close == std::string::npos) throw bad("has an unclosed '['");
  // node[07-09,12]: the prefix and the first range's start, its zeros kept.
  const std::string range = nodelist.substr(open + 1, close - open - 1);
  const std::string first = range.substr(0, range.find_first_of(",-"));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
    throw bad("has a range that does not start with a number");
  std::string host = nodelist.substr(0, open) + first;
  // A suffix after the brackets belongs to every host (node[1-2]-ib).
  const auto after = nodelist.substr(close + 1);
  return host + after.substr(0, after.find(','));
}

Launch launch_from_env() {
  Launch l;
  const int max = std::numeric_limits<int>::max();
  const Form& form = form_from_env();
  l.world_size = env_int(form.size, 1, 1 << 20, 0);
  l.rank = env_int(form.rank, 0, l.world_size - 1, 0);
  l.local_rank = env_int(form.local_rank, 0, max, l.rank);
  if (form.local_size) l.local_world_size = env_int(form.local_size, 1, max, 0);
  if (std::string(form.launcher) == "Slurm") read_slurm_local_size(l);
  l.launcher = form.launcher;
  if (l.launcher == "RANK/WORLD_SIZE" && env("TORCHELASTIC_RUN_ID")) read_torchrun(l);
  read_master_addr(l);
  l.master_port = master_port_from_env(l);
  return l;
}

void report_failure(const std::string& message) noexcept {
  static std::atomic<bool> written{false};
  const char* path = env("TORCHELASTIC_ERROR_FILE");
  if (!path || written.exchange(true)) return;
  try {
    std::string text;
    for (const char c : message) {
      if (c == '"' || c == '\\')
        text += std::string("\\") + c;
      else if (static_cast<unsigned char>(c) < 0x20) {
        char u[8];
        std::snprintf(u, sizeof u, "\\u%04x", unsigned(c));
        text += u;
      } else
        text += c;
    }
    // The layout torchrun's own workers write. Its summary prints py_callstack as the reason
    // (empty, it prints none) and takes the earliest timestamp for the root cause.
    const std::string json = "{\"message\": {\"message\": \"ScalerError: " + text +
                             "\", \"extraInfo\": {\"py_callstack\": \"ScalerError: " + text +
                             "\", \"timestamp\": \"" + std::to_string(std::time(nullptr)) +
                             "\"}}}\n";
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    std::size_t done = 0;
    while (done < json.size()) {
      const ssize_t n = ::write(fd, json.data() + done, json.size() - done);
      if (n <= 0) break;
      done += std::size_t(n);
    }
    ::close(fd);
  } catch (...) {
    // Out of memory while failing: the exit code still says it.
  }
}

}  // namespace ampactor::dist
