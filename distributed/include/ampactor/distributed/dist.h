// Data-parallel training over LibTorch's c10d: the ranks' scalers step or skip together.
//
//   auto world = ampactor::dist::init_from_env();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   ampactor::GradScaler scaler(ampactor::GradScalerOptions().ranks(world.ranks));
//
// Every unscale's found_inf is all-reduced with MAX on the thread that unscales (the optimizer
// thread for GradScaler and AsyncOptimizer), before the scale update hears of it, so every rank
// applies the same update; AsyncOptimizer's grad move also averages the gradients across the
// ranks (doc/guide/data-parallel.md). The collectives are c10d's (ProcessGroupGloo here; any
// c10d process group through over()); the store is used only to name a failed or missing rank and
// to compare the ranks' options.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ampactor/core/arg.h>
#include <ampactor/scaler/ranks.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace ampactor::dist {

/// Named options: DistOptions().timeout(std::chrono::seconds(30)). A setter refuses a value <= 0
/// with ScalerError(errc::bad_option) and changes nothing.
class DistOptions {
  /// How long a collective, the store or the start-up may wait for the other ranks before the
  /// rank fails with errc::rank_failed (default 60 s).
  AMPACTOR_ARG(std::chrono::milliseconds, timeout, std::chrono::seconds(60));
  /// The gradient average's buckets: tensors of one dtype and device are averaged as flat
  /// buffers of at most this many bytes each (default 25 MiB, as DDP's), all in flight at once.
  /// A reduce-scatter (the sharded state's) runs in chunks of this size, two in flight. Every
  /// rank must set the same.
  AMPACTOR_ARG(std::int64_t, bucket_bytes, std::int64_t(25) << 20);
  /// How often each rank ticks its heartbeat in the store; a rank whose heartbeat stopped for ten
  /// periods is named when a collective fails: gone (its process exited), hung (its process is
  /// still there, stopped or running) where the process can be checked from this host, else
  /// "hung or gone" (default 100 ms).
  AMPACTOR_ARG(std::chrono::milliseconds, heartbeat, std::chrono::milliseconds(100));
};

/// Where a process sits in the run, as its launcher said (launch_from_env) or as one sets it.
struct Launch {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  /// Ranks on this host; 0: not said.
  int local_world_size = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Whose variables were read: "torchrun", "RANK/WORLD_SIZE" (ampactor-launch or by hand),
  /// "Open MPI", "PMI", "Slurm"; empty for a Launch of one's own.
  std::string launcher;
  /// torchrun's agent already hosts a store at master_addr:master_port
  /// (TORCHELASTIC_USE_AGENT_STORE=True): init() is its client or keeps its own store elsewhere.
  bool agent_store = false;
  /// torchrun's attempt (TORCHELASTIC_RESTART_COUNT) and run id: the keys the ranks write into a
  /// store are prefixed with both, so that a restart never meets the last attempt's.
  int restart = 0;
  std::string run_id;
};

/// Reads Launch from the environment, from the first of these forms that is there:
/// 1. torchrun, ampactor-launch or by hand: RANK, WORLD_SIZE, LOCAL_RANK (default RANK),
///    LOCAL_WORLD_SIZE, MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500), and
///    torchrun's TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID;
/// 2. Open MPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
///    OMPI_COMM_WORLD_LOCAL_SIZE;
/// 3. PMI and PMIx (MPICH's and Intel MPI's launchers, srun --mpi): PMI_RANK or PMIX_RANK, with
///    PMI_SIZE, and MPI_LOCALRANKID or PMI_LOCAL_RANK;
/// 4. Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, in a job step (SLURM_STEP_ID).
/// Forms 2-4 name no store: MASTER_ADDR and MASTER_PORT when set, else under Slurm the first host
/// of SLURM_STEP_NODELIST (or SLURM_NODELIST) and port 15000 + SLURM_JOB_ID % 20000, else
/// 127.0.0.1:29500 (one host; set MASTER_ADDR for more: Open MPI's or PMI's ranks on several
/// hosts without it are refused, naming it). Slurm's local size is this node's entry of
/// SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) at SLURM_NODEID, or all for a one-node step.
/// None there, or a value that is not a number in range: ScalerError(errc::bad_option) naming every
/// form looked for, or the variable.
Launch launch_from_env();

/// The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07"); ScalerError
/// (errc::bad_option) for a list it cannot read.
std::string first_slurm_host(const std::string& nodelist);

/// Writes `message` to torchrun's TORCHELASTIC_ERROR_FILE, once per process (the first reason
/// wins), so that torchrun's failure summary shows it instead of an exit code or signal; a no-op
/// without torchrun. init() and a rank group's failing collectives call it; a program's own
/// catch of ScalerError in main may too. Never throws.
void report_failure(const std::string& message) noexcept;

/// A RankGroup over a c10d process group and the store its ranks share. The collectives run on
/// `pg` (CPU tensors, or CUDA ones for a process group named "nccl"); the store holds each
/// rank's process (pid and host), its heartbeat, the reason a rank failed or gave up, and the
/// texts require_same compares. Starts the heartbeat thread, which stops with the group, and
/// waits until every rank has called over() (at most the timeout, else errc::rank_failed naming
/// the missing ranks). Ignores SIGPIPE unless the program handles it (a write to a closed peer
/// then fails with a message instead of killing the process). Rank 0's group, which init() gives
/// the store's host, is destroyed last, so that no rank finds the store gone while it reads a
/// reason: it waits until every other rank's group is gone or its heartbeat has stopped, at most
/// the timeout. A rank whose process on this host is still there (stopped, say) is waited for too,
/// and one that resumes gets another timeout to read why the others gave up (three in all).
std::shared_ptr<RankGroup> over(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                const DistOptions& options = {});

/// One process's place in a data-parallel run.
struct World {
  Launch launch;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::shared_ptr<RankGroup> ranks;
};

/// The launcher's run end to end: launch_from_env(), a store, a ProcessGroupGloo on it, and
/// over(). The store: rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT; under torchrun, whose
/// agent hosts one there already, every rank is the agent's client when this LibTorch speaks its
/// protocol (LibTorch 2.x; AMPACTOR_AGENT_STORE=1 or 0 forces the choice), else rank 0 hosts
/// ampactor's own at MASTER_PORT + 1 (AMPACTOR_STORE_PORT names another), said once. gloo's device:
/// GLOO_SOCKET_IFNAME's interface when set; loopback when MASTER_ADDR is a loopback address and
/// every rank runs here (a local size not said counts as that; a literal 127.x or localhost is
/// always this host alone); else this host's name, or, where the name resolves to a loopback
/// address (Debian's 127.0.1.1), the address that routes to MASTER_ADDR, or on MASTER_ADDR's own
/// host the default route's or the only outward address (said once). A device on loopback while
/// ranks run on other hosts is refused at once, naming GLOO_SOCKET_IFNAME. The ranks agree on
/// WORLD_SIZE and that no rank joins twice (else every rank is refused at once, naming both). A
/// store or group that cannot be reached within the timeout fails with
/// ScalerError(errc::rank_failed) carrying c10d's error; every rank says in the store that it
/// joined before the group forms, so a rank missing at start-up is named ("ranks 0, 1 of 3 joined
/// the store at ... within the 60000 ms timeout; rank 2 did not"), and one that dies while the
/// group forms is named like one that dies later. A failure is also written to
/// TORCHELASTIC_ERROR_FILE (report_failure).
World init_from_env(const DistOptions& options = {});
/// The same from a Launch of one's own.
World init(const Launch& launch, const DistOptions& options = {});

}  // namespace ampactor::dist
