// ampactor-demo's runs and report: the settings from the command line, one training run per mode,
// and the summary table and plot of them all.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "charlm.h"

namespace ampactor {
class RankGroup;
}

namespace demo {

/// Every mode, in the order they run.
inline const std::vector<std::string> kModes = {"fp32",
                                                "fp16-noscale",
                                                "fp16-sync",
                                                "fp16-overlap",
                                                "fp16-async",
                                                "fp16-async-lagged",
                                                "fp16-async-lagged-behind",
                                                "fp16-roundpipe",
                                                "fp16-deepspeed"};

/// Whether a mode's loss is scaled (by ampactor).
inline bool scaled(const std::string& mode) {
  return mode != "fp32" && mode != "fp16-noscale";
}

struct Settings {
  int steps = 300;
  // A model deep and a batch small enough that Adam's step is a real share of an iteration, as
  // where a pipeline pays (a CPU optimizer beside a GPU's forward and backward).
  std::int64_t batch = 128;
  std::int64_t hidden = 512;
  std::int64_t layers = 4;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::vector<int> overflow_at;  // forced overflows: the loss scaled up 1e5x
  int spike_at = -1;             // the burst's first iteration (-1: 60% of the steps)
  int spike_length = 4;          // 0: no burst
  int spike_factor = 16;
  int growth_interval = 10;  // short, so that 300 steps reach the overflow regime
  double workers = 2048;     // x batch 128: the global batch of 262144 characters
  int probe_every = 25;
  int threads = 1;  // the trainer's; the optimizer's thread has its own core
  std::string out = "out/demo";
  std::string text_dir = "/usr/share/common-licenses";
  std::string device = "cpu";
  std::string trace;                // record each scaled run's keeper messages (JSON Lines)
  std::string optimizer = "fused";  // the asynchronous runs' Adam: fused or torch
  int behind_ms = 80;  // fp16-async-lagged-behind: each optimizer job starts this much later
  std::vector<std::string> modes = kModes;
  int nproc = 0;  // > 1: the runs again over this many data-parallel ranks
  // In a rank of such a run: its group, its index and the rank count.
  std::shared_ptr<ampactor::RankGroup> ranks;
  int rank = 0, world = 1;

  ModelShape shape(std::int64_t vocab) const {
    ModelShape m;
    m.vocab = vocab;
    m.hidden = hidden;
    m.layers = layers;
    return m;
  }

  bool in_spike(int k) const {
    return spike_length > 0 && k >= spike_at && k < spike_at + spike_length;
  }
};

struct Summary {
  std::string mode;
  double train_loss = 0;  // mean over the last 20 iterations
  double eval_loss = 0;   // held-out text, fp32 math on the final weights
  int skipped = 0;
  int backoffs = 0;
  double final_scale = 0;
  double underflow = -1;      // share of fp32-non-zero weight-gradient elements that fp16 zeroed
  double act_underflow = -1;  // the same at the fp16 activation boundaries of backward
  double wall_s = 0;
  /// The layers whose gradients held inf or NaN, with the iterations each did: "out.weight 12,
  /// hidden.weight 3" (the scaler's overflow reports; "" for none or fp32); and in the burst.
  std::string overflowed, burst_overflowed;
};

/// One run of `mode`. Writes out/<mode>.csv (per iteration) and out/<mode>.probe.csv (eval loss
/// and underflow every probe_every iterations).
Summary run(const std::string& mode, const Corpus& corpus, const ModelShape& shape,
            const Settings& s);

/// --trace FILE: the trace of one scaled run ("" when not recording it).
std::string trace_file(const Settings& s, const std::string& mode);

/// fp16-overlap against fp16-sync, when both ran: whether every loss, scale and skip and the eval
/// losses are equal bit for bit (what differs, if not), and the speeds.
struct PipelineCase {
  bool equal = false;
  std::string differs;
  double sync_ips = 0, overlap_ips = 0;
  double ratio() const { return overlap_ips / sync_ips; }
};
std::optional<PipelineCase> pipeline_case(const Settings& s, const std::vector<Summary>& runs);

/// The closing table on stdout and out/summary.csv.
void report(const Settings& s, const std::vector<Summary>& runs);

/// out/demo.png through gnuplot (and out/demo.gp, kept to plot by hand).
void plot(const Settings& s, const std::vector<Summary>& runs);

/// --nproc (dp.cpp): whether this process is a rank (ampactor-launch set RANK); make it one (its
/// group, and its outputs under out/dp/rank<R>); start the ranks; compare them with the
/// single-process runs (a table, out/dp/<mode>.csv, out/dp.png). The ranks must skip alike.
bool is_rank();
void become_rank(Settings& s);
int launch_ranks(const Settings& s, int argc, char** argv);
void compare_data_parallel(const Settings& s, const std::vector<Summary>& single);

/// Sets flush-to-zero on this thread and its OpenMP team (see run.cpp).
void flush_denormals();

}  // namespace demo
