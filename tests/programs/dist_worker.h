// ampactor-dist-worker's two halves: dist_worker.cpp reads the command line and starts the rank
// (the program and its models are described there); dist_worker_train.cpp runs its training and
// writes what the tests compare.
#pragma once

#include <ampactor/scaler/ranks.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>

namespace dist_worker {

/// The command line, as dist_worker.cpp reads it.
struct Settings {
  std::string path = "actor", model = "exact", out = ".", policy = "exact", trace;
  int steps = 20, staleness = 1, single = 0, growth_interval = 3;
  std::int64_t batch = 8;
  double init_scale = 1024;
  bool defer = false, swap = false;
  bool defer_move = false;              // defer_grad_move alone
  bool fused = false, overlap = false;  // FusedSGD; overlap_backward (with --fused)
  bool print_overflow = false;          // a "last_overflow K ranks R..." line after training
  bool shard = false, adam = false;     // shard_optimizer_state; Adam instead of SGD
  bool print_model = false;             // the "param" lines from the model, not the masters
  bool cuda = false;                    // the model on the GPU, the masters on the CPU
  int save_at = -1;                     // pipeline: save the run after this iteration
  int save_every = 0;                   // ... and after every N-th (0: none)
  std::string replicas = "auto";        // shard_replicas: auto | off | buddy
  int step_ms = 0;                      // a pause per iteration, for a fault to land mid-run
  int width = 0;                        // mlp: a hidden layer of width x width (0: 8-16-4)
  bool time_saves = false;              // say how long the saves took, in all
  std::string ckpt;                     // ... into CKPT (--shard: its manifest); --resume: load it
  bool resume = false;
  bool resume_any = false;          // resume_run: load where a checkpoint is, else start afresh
  bool abort_on_failure = false;    // an error ends the process by std::abort, as uncaught ones do
  double clip = 0;                  // clip_grad_norm (0: none)
  std::int64_t bucket_bytes = 256;  // overlap's buckets: a layer's weight or bias each
  std::set<std::pair<int, int>> inf_at, die_at, throw_at, stop_at;  // (rank, iteration)
  int timeout_ms = 20000;
  std::int64_t dist_bucket_bytes = 0;  // DistOptions::bucket_bytes (0: its default)
  // Rank 1's own settings (0 or empty: the others').
  int odd_interval = 0;
  double odd_init_scale = 0, odd_growth = 0;
  std::string odd_policy, odd_rule;
  bool odd_shard = false;
};

/// The run of this rank, once the group is up (none with --single): writes OUT/rank<R>.txt.
void run(Settings& s, int rank, int shards, std::shared_ptr<ampactor::RankGroup> group);

}  // namespace dist_worker
