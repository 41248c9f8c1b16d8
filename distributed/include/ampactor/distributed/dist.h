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

/// torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR (default
/// 127.0.0.1) and MASTER_PORT (default 29500).
struct Launch {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// Reads Launch from the environment. A missing RANK or WORLD_SIZE, or a value that is not a
/// number in range, is refused with ScalerError(errc::bad_option) naming the variable.
Launch launch_from_env();

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

/// torchrun's convention end to end: launch_from_env(), a TCPStore at MASTER_ADDR:MASTER_PORT
/// (rank 0 hosts it and waits for the others), a ProcessGroupGloo on it (on loopback when
/// MASTER_ADDR is a loopback address, on GLOO_SOCKET_IFNAME's interface when that is set, else on
/// this host's name), and over(). A store or group that cannot be reached within the timeout
/// fails with ScalerError(errc::rank_failed) carrying c10d's error; every rank says in the store
/// that it joined before the group forms, so a rank missing at start-up is named ("ranks 0, 1 of 3
/// joined the store at ... within the 60000 ms timeout; rank 2 did not"), and one that dies while
/// the group forms is named like one that dies later.
World init_from_env(const DistOptions& options = {});
/// The same from a Launch of one's own.
World init(const Launch& launch, const DistOptions& options = {});

}  // namespace ampactor::dist
