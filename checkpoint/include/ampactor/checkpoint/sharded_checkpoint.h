// Checkpoints of a run whose pipeline shards its optimizer state (shard_optimizer_state): each
// rank's shard in a file of its own, and a manifest that names them. save_run and load_run write
// and read them (collectives then: every rank calls them at the same step); the functions here
// check them, consolidate them into one ordinary checkpoint, and re-shard them to another number
// of ranks (the ampactor-ckpt tool runs them). Torch-free declarations.
#pragma once

#include <ampactor/core/shard_layout.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ampactor {

/// What save_run writes at its path for a sharded run (JSON, rank 0 writes it last, atomically):
/// the step, the layout, the parameters' shapes and, for each rank, its shard's file (beside the
/// manifest: PATH.step<K>.rank<R>-of-<N>), size and digest.
struct ShardManifest {
  struct Shard {
    int rank = 0;
    std::string file;  // its name, in the manifest's folder
    std::uint64_t bytes = 0;
    std::string digest;  // "fnv1a64w:" and 16 hex digits (file_digest)
  };
  std::int64_t step = 0;
  std::vector<std::int64_t> numels;  // the layout's parameters
  int world = 1;
  std::int64_t granule = 1;
  std::vector<std::vector<std::int64_t>> shapes;  // each parameter's
  std::vector<Shard> shards;                      // one per rank, in rank order

  ShardLayout layout() const { return ShardLayout(numels, world, granule); }
  /// Where rank r's shard file is, given the manifest's own path.
  std::string shard_path(const std::string& manifest_path, int rank) const;
  std::string to_json() const;
};

/// The manifest at `path`, checked for form (every rank once, in order; shapes that fit the
/// layout). Anything else, an ordinary checkpoint included: ScalerError(errc::bad_checkpoint).
ShardManifest read_manifest(const std::string& path);
/// Whether the file at `path` is a sharded run's manifest (it starts with '{'), not a checkpoint.
bool is_manifest(const std::string& path);
/// The digest a manifest records: FNV-1a over the file's 64-bit words (the tail zero-padded) and
/// its length, "fnv1a64w:" and 16 hex digits. Sets *bytes to the file's size when given.
/// ScalerError(errc::bad_checkpoint) if the file cannot be read.
std::string file_digest(const std::string& path, std::uint64_t* bytes = nullptr);
/// Each shard of the manifest at `path` is there, of the size and digest recorded. The first
/// that is not: ScalerError(errc::bad_checkpoint) naming its rank, its file and what differs.
ShardManifest check_sharded_run(const std::string& path);

/// The sharded run at `manifest` as one ordinary checkpoint at `out` (written atomically), as
/// save_run writes it for the same run unsharded: load_run resumes it in a pipeline without
/// shard_optimizer_state, on any number of ranks (or none). The shards are checked first
/// (check_sharded_run); their optimizers must hold one parameter group over the pipeline's
/// optim_parameters(), in order, and agree on the step counts, the scaler and the options.
/// Errors: ScalerError(errc::bad_checkpoint) naming the rank and the reason, nothing written.
/// progress, when given, hears a line per file read or written (ampactor-ckpt prints them).
void consolidate_run(const std::string& manifest, const std::string& out,
                     const std::function<void(const std::string&)>& progress = nullptr);
/// The run at `in` (a manifest, or an ordinary checkpoint of the same pipeline unsharded) as a
/// sharded run of `world` ranks: the manifest at `out`, the shard files beside it. load_run
/// resumes it on `world` ranks with shard_optimizer_state, bit for bit the saved state. Errors as
/// consolidate_run's; a world below 1: ScalerError(errc::bad_option). Holds the whole state in
/// memory once.
void reshard_run(const std::string& in, int world, const std::string& out,
                 const std::function<void(const std::string&)>& progress = nullptr);

}  // namespace ampactor
