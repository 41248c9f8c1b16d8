// What each launcher's environment makes of a rank (launch_from_env), torchrun's error file, and
// the refusals at init: two world sizes, a rank that joins twice (a loopback device: in
// tests/hosts/run-under.sh, on real hosts).
#include "dist_fixture.h"

#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include <cstdlib>
#include <map>

using namespace ampactor::test::dist;
namespace dist = ampactor::dist;

namespace {

const char* const kAll[] = {"RANK",
                            "WORLD_SIZE",
                            "LOCAL_RANK",
                            "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR",
                            "MASTER_PORT",
                            "TORCHELASTIC_RUN_ID",
                            "TORCHELASTIC_USE_AGENT_STORE",
                            "TORCHELASTIC_RESTART_COUNT",
                            "TORCHELASTIC_ERROR_FILE",
                            "OMPI_COMM_WORLD_RANK",
                            "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "PMI_RANK",
                            "PMI_SIZE",
                            "PMIX_RANK",
                            "MPI_LOCALRANKID",
                            "MPI_LOCALNRANKS",
                            "PMI_LOCAL_RANK",
                            "PMI_LOCAL_SIZE",
                            "SLURM_PROCID",
                            "SLURM_NTASKS",
                            "SLURM_LOCALID",
                            "SLURM_STEP_ID",
                            "SLURM_STEPID",
                            "SLURM_JOB_ID",
                            "SLURM_NODELIST",
                            "SLURM_STEP_NODELIST",
                            "SLURM_STEP_NUM_NODES",
                            "SLURM_NNODES",
                            "SLURM_STEP_TASKS_PER_NODE",
                            "SLURM_TASKS_PER_NODE",
                            "SLURM_NODEID"};

/// The launcher variables set to `vars` alone for the test's span, as they were after.
struct Env {
  std::map<std::string, std::string> saved;
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* n : kAll) {
      if (const char* v = std::getenv(n)) saved[n] = v;
      ::unsetenv(n);
    }
    for (const auto& [n, v] : vars)
      ::setenv(n.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* n : kAll)
      ::unsetenv(n);
    for (const auto& [n, v] : saved)
      ::setenv(n.c_str(), v.c_str(), 1);
  }
};

std::string refusal(const std::map<std::string, std::string>& vars) {
  Env e(vars);
  try {
    dist::launch_from_env();
  } catch (const ampactor::ScalerError& err) {
    return err.what();
  }
  return "";
}

}  // namespace

TEST_CASE("launch_from_env reads torchrun's variables and its agent store, attempt and run id") {
  Env e({{"RANK", "1"},
         {"WORLD_SIZE", "4"},
         {"LOCAL_RANK", "1"},
         {"LOCAL_WORLD_SIZE", "2"},
         {"MASTER_ADDR", "10.1.2.3"},
         {"MASTER_PORT", "29600"},
         {"TORCHELASTIC_RUN_ID", "job7"},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
         {"TORCHELASTIC_RESTART_COUNT", "2"},
         // A launcher inside another: torchrun's variables win over the outer srun's.
         {"SLURM_PROCID", "0"},
         {"SLURM_NTASKS", "1"},
         {"SLURM_STEP_ID", "0"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.launcher == "torchrun");
  CHECK(l.rank == 1);
  CHECK(l.world_size == 4);
  CHECK(l.local_rank == 1);
  CHECK(l.local_world_size == 2);
  CHECK(l.master_addr == "10.1.2.3");
  CHECK(l.master_port == 29600);
  CHECK(l.agent_store);
  CHECK(l.restart == 2);
  CHECK(l.run_id == "job7");
}

TEST_CASE("launch_from_env without torchrun's agent is RANK/WORLD_SIZE with no agent store") {
  Env e({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.launcher == "RANK/WORLD_SIZE");
  CHECK_FALSE(l.agent_store);
  CHECK(l.local_rank == 0);
  CHECK(l.master_addr == "127.0.0.1");
  CHECK(l.master_port == 29500);
}

TEST_CASE("launch_from_env reads Open MPI's variables, MASTER_ADDR and MASTER_PORT beside them") {
  Env e({{"OMPI_COMM_WORLD_RANK", "3"},
         {"OMPI_COMM_WORLD_SIZE", "4"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
         {"PMIX_RANK", "3"},
         {"MASTER_ADDR", "node1"},
         {"MASTER_PORT", "4000"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.launcher == "Open MPI");
  CHECK(l.rank == 3);
  CHECK(l.world_size == 4);
  CHECK(l.local_rank == 1);
  CHECK(l.local_world_size == 2);
  CHECK(l.master_addr == "node1");
  CHECK(l.master_port == 4000);
}

TEST_CASE("launch_from_env refuses Open MPI's ranks on several hosts without MASTER_ADDR") {
  const std::string e = refusal({{"OMPI_COMM_WORLD_RANK", "2"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK_MESSAGE(
      e.find("Open MPI started 4 ranks, 2 of them on this host, and MASTER_ADDR is not "
             "set: name rank 0's host (mpirun -x MASTER_ADDR=<host>)") != std::string::npos,
      e);
  // All on one host: 127.0.0.1 reaches rank 0.
  Env one({{"OMPI_COMM_WORLD_RANK", "1"},
           {"OMPI_COMM_WORLD_SIZE", "2"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(dist::launch_from_env().master_addr == "127.0.0.1");
}

TEST_CASE("launch_from_env reads PMI's variables") {
  Env e({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.launcher == "PMI");
  CHECK(l.rank == 1);
  CHECK(l.world_size == 2);
  CHECK(l.local_rank == 1);
}

TEST_CASE("launch_from_env reads srun's variables: the first host of the step and a job's port") {
  Env e({{"SLURM_PROCID", "2"},
         {"SLURM_NTASKS", "4"},
         {"SLURM_LOCALID", "0"},
         {"SLURM_STEP_ID", "0"},
         {"SLURM_JOB_ID", "123456"},
         {"SLURM_NODELIST", "login[1-2]"},
         {"SLURM_STEP_NODELIST", "gpu[07-08,12],cpu1"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.launcher == "Slurm");
  CHECK(l.rank == 2);
  CHECK(l.world_size == 4);
  CHECK(l.master_addr == "gpu07");
  CHECK(l.master_port == 15000 + 123456 % 20000);
  CHECK(l.local_world_size == 0);  // unknown: the step spans several nodes, or may
}

TEST_CASE("launch_from_env under Slurm reads this node's ranks from the tasks-per-node list") {
  const auto local = [](const char* list, const char* node) {
    Env e({{"SLURM_PROCID", "3"},
           {"SLURM_NTASKS", "7"},
           {"SLURM_STEP_ID", "0"},
           {"SLURM_STEP_NUM_NODES", "4"},
           {"SLURM_STEP_TASKS_PER_NODE", list},
           {"SLURM_NODEID", node}});
    return dist::launch_from_env().local_world_size;
  };
  CHECK(local("2(x3),1", "0") == 2);
  CHECK(local("2(x3),1", "2") == 2);
  CHECK(local("2(x3),1", "3") == 1);
  CHECK(local("3,1,2,1", "2") == 2);
  CHECK(local("2(x3)", "5") == 0);  // no such node: not said
  CHECK(local("many", "0") == 0);
}

TEST_CASE("launch_from_env under Slurm knows every rank is local in a step on one node") {
  Env e({{"SLURM_PROCID", "1"},
         {"SLURM_NTASKS", "2"},
         {"SLURM_STEP_ID", "0"},
         {"SLURM_NNODES", "2"},
         {"SLURM_STEP_NUM_NODES", "1"}});
  CHECK(dist::launch_from_env().local_world_size == 2);
}

TEST_CASE("launch_from_env under Slurm takes MASTER_ADDR and MASTER_PORT where they are set") {
  Env e({{"SLURM_PROCID", "0"},
         {"SLURM_NTASKS", "2"},
         {"SLURM_STEPID", "1"},
         {"SLURM_JOB_ID", "5"},
         {"SLURM_NODELIST", "a,b"},
         {"MASTER_ADDR", "b"},
         {"MASTER_PORT", "31000"}});
  const dist::Launch l = dist::launch_from_env();
  CHECK(l.master_addr == "b");
  CHECK(l.master_port == 31000);
}

TEST_CASE("launch_from_env outside a job step (an sbatch script itself) is no rank") {
  const std::string e = refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  CHECK(e.find("no launcher's variables are set") != std::string::npos);
}

TEST_CASE("launch_from_env's refusal names every form it looked for") {
  const std::string e = refusal({});
  for (const char* v :
       {"RANK and WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
        "SLURM_STEP_ID", "ampactor-launch", "torchrun", "mpirun", "srun"})
    CHECK_MESSAGE(e.find(v) != std::string::npos, v, " in: ", e);
}

TEST_CASE("launch_from_env names a form set by half and a value out of range") {
  CHECK(refusal({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not") != std::string::npos);
  CHECK(refusal({{"OMPI_COMM_WORLD_SIZE", "2"}})
            .find("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not") !=
        std::string::npos);
  CHECK(refusal({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is not an integer in [0, 1]") !=
        std::string::npos);
  CHECK(refusal({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})
            .find("MASTER_PORT=70000") != std::string::npos);
}

TEST_CASE("first_slurm_host reads Slurm's compressed host lists") {
  CHECK(dist::first_slurm_host("node1") == "node1");
  CHECK(dist::first_slurm_host("node1,node2") == "node1");
  CHECK(dist::first_slurm_host("node[01-04,07]") == "node01");
  CHECK(dist::first_slurm_host("node[7,9]") == "node7");
  CHECK(dist::first_slurm_host("a1,node[3-4]") == "a1");
  CHECK(dist::first_slurm_host("rack[2-3]-ib,x") == "rack2-ib");
  for (const char* bad : {"", "node[1-2", "node[a-b]", ",x"})
    CHECK_THROWS_AS(dist::first_slurm_host(bad), ampactor::ScalerError);
}

TEST_CASE("report_failure writes torchrun's error file once, the first reason") {
  const fs::path dir = fresh("error-file");
  const std::string path = (dir / "error.json").string();
  // Without torchrun's variable: nothing written, and the one write still to come.
  {
    Env e({});
    dist::report_failure("not written");
  }
  CHECK_FALSE(fs::exists(path));
  Env e({{"TORCHELASTIC_ERROR_FILE", path}});
  dist::report_failure("rank 1 failed: \"quoted\"\nsecond line");
  dist::report_failure("a later reason");
  const std::string json = slurp(path);
  CHECK(
      json.find(
          R"({"message": {"message": "ScalerError: rank 1 failed: \"quoted\"\u000asecond line")") ==
      0);
  CHECK(json.find("\"timestamp\": \"") != std::string::npos);
  CHECK(json.find("a later reason") == std::string::npos);
}

namespace {

bool has(const std::string& line, const std::string& what) {
  return line.find(what) != std::string::npos;
}

using std::chrono::seconds;

}  // namespace

TEST_CASE("ranks started with two world sizes are refused at once on every rank, naming both") {
  const fs::path dir = fresh("two-worlds");
  const int port = free_port();
  const std::vector<std::string> args = {"--path", "actor", "--steps", "3"};
  const auto start = std::chrono::steady_clock::now();
  Rank r0(dir, 0, 2, port, args), r1(dir, 1, 3, port, args);
  CHECK(r1.wait(seconds(30)) == 1);
  CHECK(r0.wait(seconds(30)) == 1);
  // Far below the 3 s timeout after both started (LibTorch's start-up is most of it).
  CHECK(std::chrono::steady_clock::now() - start < seconds(kRankTimeoutMs / 1000 + 8));
  for (Rank* r : {&r0, &r1}) {
    const std::string line = r->said();
    CAPTURE(line);
    // Whichever joined first sets the run's size; the other is named against it.
    CHECK(has(line, "WORLD_SIZE=3"));
    CHECK(has(line, "WORLD_SIZE=2"));
    CHECK(has(line, "every rank must be started with one world size"));
    CHECK_FALSE(has(line, "timeout;"));
  }
}

TEST_CASE("a rank that joins twice is refused at once on every rank, naming both processes") {
  const fs::path dir = fresh("joined-twice"), dir2 = fresh("joined-twice-2");
  const int port = free_port();
  const std::vector<std::string> args = {"--path", "actor", "--steps", "3"};
  // Ranks 0 and 1 of 3, rank 1 again (with its own log), and no rank 2.
  Rank r0(dir, 0, 3, port, args), first(dir, 1, 3, port, args), second(dir2, 1, 3, port, args);
  const pid_t pids[] = {first.pid(), second.pid()};
  for (Rank* r : {&r0, &first, &second})
    CHECK(r->wait(seconds(30)) == 1);
  for (Rank* r : {&r0, &first, &second}) {
    const std::string line = r->said();
    CAPTURE(line);
    CHECK(has(line, "rank 1 joined twice: process "));
    for (const pid_t pid : pids)
      CHECK(has(line, "process " + std::to_string(pid) + " on "));
    CHECK_FALSE(has(line, "timeout;"));
  }
}
