// A whole training run in one checkpoint file: the model, the optimizer, the scaler and the
// pipeline, saved and loaded together (atomically, checked before anything changes), and a
// sharded pipeline's run as each rank's shard and a manifest (collectives then). ampactor::run.
#pragma once

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/core/arg.h>

#include <cstdint>
#include <string>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace ampactor {

class GradScaler;
class AsyncOptimizer;

/// The parts of a training run that one checkpoint file holds, each optional:
///   ampactor::RunParts().model(model.get()).optimizer(&opt).scaler(&scaler).pipeline(&pipe)
class RunParts {
  // Aliases: the option macros write `const T&`, which a spelled-out pointer type would bind wrong.
  using Model = torch::nn::Module*;
  using Optimizer = torch::optim::Optimizer*;
  using Scaler = GradScaler*;
  using Pipeline = AsyncOptimizer*;
  AMPACTOR_ARG_ANY(Model, model, nullptr);
  AMPACTOR_ARG_ANY(Optimizer, optimizer, nullptr);
  AMPACTOR_ARG_ANY(Scaler, scaler, nullptr);
  AMPACTOR_ARG_ANY(Pipeline, pipeline, nullptr);
};

/// The run's parts and `step` in one file, atomically (save_atomically), under the keys "step",
/// "model", "optimizer", "scaler" and "pipeline" (the layout of the guide's manual checkpoint).
/// The pipeline is saved first: it waits for the steps in flight, so the optimizer holds still.
/// With a pipeline that shards its optimizer state it is a collective (every rank calls it at the
/// same step, with the same path): each rank writes its shard to PATH.step<K>.rank<R>-of-<N>,
/// then rank 0 the manifest at `path` (<ampactor/checkpoint/sharded_checkpoint.h>), once every
/// shard is written; then each rank removes its shard files of earlier saves at `path`. A rank
/// that cannot write: every rank throws ScalerError(errc::bad_checkpoint) naming it, and the
/// manifest still names the last save's shards.
void save_run(const std::string& path, const RunParts& parts, std::int64_t step);
/// Loads a whole run into the live parts, or nothing: the file is screened (load_checkpoint); the
/// model's parameters and buffers (names, shapes, dtypes: LibTorch's Module::load checks none),
/// the scaler's state and the pipeline's masters are checked against the live objects before
/// anything changes; the optimizer, which only LibTorch can read, is loaded first from a
/// snapshot-backed copy and its state checked against its parameters (Adam, AdamW, SGD and the
/// fused ones); if any part refuses, every part is as it was. A part of `parts` the file lacks
/// is refused too; one in the file that `parts` leaves out is not read (the model alone, for
/// evaluation). Errors: ScalerError(errc::bad_checkpoint) naming the part. Returns the saved
/// step. With a scaler that has ranks (data parallel, unsharded), every rank loads its own copy
/// of `path` and the ranks agree before anything changes: a rank that cannot load it, or whose
/// copy holds another step or another model (a digest of its tensors), is refused on every rank,
/// naming it.
/// With a pipeline that shards its optimizer state, `path` is the manifest and it is a
/// collective: rank 0 reads the manifest and every rank gets it, each checks its shard file
/// (size, digest) and its parts, then the ranks agree: if any refuses, every rank throws naming
/// that rank and its reason, and none loads anything. A save made on another number of ranks is
/// re-sharded to this one as reshard_run does, from the shards the ranks' disks hold (their own
/// and their buddies' replicas: AsyncOptimizerOptions::shard_replicas), each rank holding the
/// whole state once; a shard no rank holds whole is refused on every rank, naming it. A
/// manifest given to an unsharded pipeline is refused (consolidate_run).
std::int64_t load_run(const std::string& path, const RunParts& parts);
/// load_run where there is a checkpoint to resume, for a program that a launcher may restart:
/// returns the saved step, or -1 where there is none (nothing changed). With ranks (the scaler's,
/// or a sharded pipeline's) it is a collective and one decision: every rank loads, or none; a
/// checkpoint that only some ranks have (another host's disk) is refused on every rank naming
/// them, ScalerError(errc::bad_checkpoint). A sharded run's manifest is rank 0's to find.
std::int64_t resume_run(const std::string& path, const RunParts& parts);

}  // namespace ampactor
