// ampactor-dist-worker: one rank of the data-parallel tests (run by ampactor-launch, or alone with
// --single N as one process over the N ranks' concatenated batches). Writes OUT/rank<R>.txt: a
// line "k scale found_inf" per iteration (with --clip, the step's gradient norm too), then "param
// <index> <hex of each float>" lines.
//
// Models: "exact", whose loss is linear in the weights with inputs in {-1, 0, 1} and power-of-two
// batches, so every gradient, its mean over ranks and its mean over the concatenated batch are
// exact in fp32 (the runs can be compared bit for bit); "mlp", a tanh MLP (compared across ranks).
#include "dist_worker.h"

#include <ampactor/distributed/dist.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using dist_worker::Settings;

/// The options; --inf-at, --die-at, --throw-at and --stop-at into `inf_at`, `die_at`, `throw_at`,
/// `stop_at` as given.
void add_options(CLI::App& app, Settings& s, std::vector<std::string>& inf_at,
                 std::vector<std::string>& die_at, std::vector<std::string>& throw_at,
                 std::vector<std::string>& stop_at) {
  app.add_option("--path", s.path, "local | actor | pipeline | collectives");
  app.add_option("--model", s.model, "exact | mlp");
  app.add_option("--policy", s.policy, "exact | lagged");
  app.add_option("--steps", s.steps);
  app.add_option("--batch", s.batch, "samples per rank");
  app.add_option("--staleness", s.staleness);
  app.add_flag("--defer", s.defer, "defer_grad_move and swap_weights");
  app.add_flag("--defer-move", s.defer_move, "defer_grad_move alone");
  app.add_flag("--swap", s.swap, "swap_weights alone");
  app.add_flag("--fused", s.fused, "pipeline: ampactor::optim::FusedSGD instead of torch's SGD");
  app.add_flag("--overlap", s.overlap, "pipeline: overlap_backward (needs --fused, staleness 0)");
  app.add_flag("--print-overflow", s.print_overflow, "print the scaler's last_overflow()");
  app.add_flag("--shard", s.shard, "pipeline: shard_optimizer_state");
  app.add_flag("--adam", s.adam, "pipeline: Adam (FusedAdam with --fused) instead of SGD");
  app.add_flag("--print-model", s.print_model, "the param lines from the model's weights");
  app.add_flag("--cuda", s.cuda, "pipeline: the model on the GPU, master_device(kCPU)");
  app.add_option("--save-at", s.save_at, "pipeline: save_run after this iteration (--ckpt)");
  app.add_option("--save-every", s.save_every, "pipeline: save_run after every N-th iteration");
  app.add_option("--replicas", s.replicas, "shard_replicas: auto | off | buddy")
      ->check(CLI::IsMember({"auto", "off", "buddy"}));
  app.add_option("--step-ms", s.step_ms, "a pause of this many ms in each iteration");
  app.add_option("--width", s.width, "mlp: a hidden layer of width x width");
  app.add_flag("--time-saves", s.time_saves, "print the saves' count and time to stderr");
  app.add_option("--ckpt", s.ckpt, "the checkpoint's path (CKPT.rank<R>.pt unsharded)");
  app.add_flag("--resume", s.resume, "pipeline: load_run from --ckpt first, go on after it");
  app.add_flag("--abort-on-failure", s.abort_on_failure, "an error aborts, as an uncaught one");
  app.add_flag("--resume-any", s.resume_any, "pipeline: resume_run from --ckpt, if one is there");
  app.add_option("--clip", s.clip, "pipeline: clip_grad_norm's max_norm");
  app.add_option("--bucket-bytes", s.bucket_bytes, "overlap_backward's bucket_bytes");
  app.add_option("--single", s.single, "one process over N ranks' concatenated batches");
  app.add_option("--init-scale", s.init_scale);
  app.add_option("--growth-interval", s.growth_interval);
  app.add_option("--rank1-growth-interval", s.odd_interval, "rank 1 starts with another interval");
  app.add_option("--rank1-policy", s.odd_policy, "rank 1 starts with another policy");
  app.add_option("--rank1-init-scale", s.odd_init_scale, "rank 1 starts with another init_scale");
  app.add_option("--rank1-growth-factor", s.odd_growth, "rank 1 starts with another growth_factor");
  app.add_option("--rank1-rule", s.odd_rule, "rank 1 starts with another rule's preset");
  app.add_flag("--rank1-shard", s.odd_shard, "rank 1's pipeline shards its state, the others not");
  app.add_option("--inf-at", inf_at, "RANK:ITER: an inf in that rank's gradients");
  app.add_option("--die-at", die_at, "RANK:ITER: that rank SIGKILLs itself there");
  app.add_option("--throw-at", throw_at, "RANK:ITER: that rank's step job throws there");
  app.add_option("--stop-at", stop_at,
                 "RANK:ITER: that rank SIGSTOPs itself there (until SIGCONT)");
  app.add_option("--timeout-ms", s.timeout_ms);
  app.add_option("--dist-bucket-bytes", s.dist_bucket_bytes, "DistOptions::bucket_bytes");
  app.add_option("--trace", s.trace, "record the keeper's trace to TRACE.rank<R>.jsonl");
  app.add_option("--out", s.out);
}

std::pair<int, int> rank_iter(const std::string& s) {
  const auto colon = s.find(':');
  if (colon == std::string::npos) throw std::invalid_argument("expected RANK:ITER, got " + s);
  return {std::stoi(s.substr(0, colon)), std::stoi(s.substr(colon + 1))};
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  std::vector<std::string> inf_at, die_at, throw_at, stop_at;
  CLI::App app{"one rank of ampactor's data-parallel tests"};
  add_options(app, s, inf_at, die_at, throw_at, stop_at);
  CLI11_PARSE(app, argc, argv);
  for (auto& v : inf_at)
    s.inf_at.insert(rank_iter(v));
  for (auto& v : die_at)
    s.die_at.insert(rank_iter(v));
  for (auto& v : throw_at)
    s.throw_at.insert(rank_iter(v));
  for (auto& v : stop_at)
    s.stop_at.insert(rank_iter(v));

  int rank = 0, world = 1;
  std::shared_ptr<ampactor::RankGroup> ranks;
  ampactor::dist::World w;
  try {
    if (s.single == 0) {
      auto options = ampactor::dist::DistOptions().timeout(std::chrono::milliseconds(s.timeout_ms));
      if (s.dist_bucket_bytes > 0) options.bucket_bytes(s.dist_bucket_bytes);
      w = ampactor::dist::init_from_env(options);
      rank = w.launch.rank, world = w.launch.world_size, ranks = w.ranks;
    }
    dist_worker::run(s, rank, s.single > 0 ? s.single : world, ranks);
    return 0;
  } catch (const std::exception& e) {
    // One write, so that the ranks' lines in a shared log never interleave.
    const std::string line =
        "ampactor-dist-worker rank " + std::to_string(rank) + ": " + e.what() + "\n";
    std::fputs(line.c_str(), stderr);
    if (s.abort_on_failure) std::abort();
    return 1;
  }
}
