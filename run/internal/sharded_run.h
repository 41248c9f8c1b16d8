// save_run and load_run with a pipeline that shards its optimizer state: collectives that write
// and read each rank's shard file and rank 0's manifest, every rank agreeing before anything is
// published or changed.
#pragma once

#include <ampactor/pipeline/async_optimizer.h>
#include "checkpoint/internal/sharded_files.h"
#include "pipeline/internal/run_access.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ampactor {
class RankGroup;
class RunParts;
class ShardLayout;
}  // namespace ampactor

namespace ampactor::internal {

/// Every rank's `mine`, in rank order: two all-gathers, the lengths then the padded bytes.
std::vector<std::string> gather_strings(RankGroup& ranks, const std::string& mine);

/// Each rank passes its error ("" for none); if any rank has one, every rank throws
/// ScalerError(errc::bad_checkpoint): what(the first failing rank), then its error.
void agree(RankGroup& ranks, const std::string& error, const std::function<std::string(int)>& what);

/// Agrees an error through `agree` instead of throwing it: the hook load_run_file calls once its
/// checks are done and before anything it cannot undo.
using AgreeFn = std::function<void(const std::string& error, std::int64_t step,
                                   const std::string& model_digest)>;

/// save_run for a sharded pipeline: run_bytes() is this rank's whole run, as a file's bytes.
void save_sharded_run(const std::string& path, const RunParts& parts, std::int64_t step,
                      const std::function<std::string()>& run_bytes);
/// load_run for a sharded pipeline: load_file(f, agree) loads this rank's file f as load_run
/// does, calling agree before it changes anything.
std::int64_t load_sharded_run(
    const std::string& path, const RunParts& parts,
    const std::function<std::int64_t(const std::string&, const AgreeFn&)>& load_file);

/// A sharded save's replicas (AsyncOptimizerOptions::shard_replicas): the ring shift that puts
/// each rank's buddy on another host (0: none), and whether this rank writes the manifest too
/// (the first rank of each host but rank 0's), from every rank's host name in rank order.
struct Replicas {
  int by = 0;
  bool writes_manifest = false;
};
Replicas plan_replicas(const std::vector<std::string>& hosts, int rank, ShardReplicas mode);
/// `n` bytes to `path`, whole or not at all, not flushed to the disk: a replica (of a shard or
/// of the manifest) guards against the other host's loss, and this host's page cache keeps it.
void write_unflushed(const char* data, std::size_t n, const std::string& path);
/// This process's host name.
std::string host_name();
/// Sends this rank's shard (`mine`, its file's bytes) to its buddy and writes the one it
/// receives (rank `from`'s, of `expected_bytes`) as the file `theirs`, unless `write` is false
/// (then only its length is checked); this rank's error, or "".
std::string exchange_replicas(RankGroup& ranks, int by, const std::string& mine,
                              const std::string& theirs, std::uint64_t expected_bytes,
                              bool write = true);
/// An empty file beside a save, named for its rank and at random, removed when
/// this is destroyed: a rank that finds another's in its own folder shares that folder (a disk
/// the hosts share), where a replica would only replace its flushed original by an unflushed
/// copy. name() is "" if it could not be made.
class FolderProbe {
 public:
  FolderProbe(const std::string& folder, const std::string& base, int rank);
  ~FolderProbe();
  FolderProbe(const FolderProbe&) = delete;
  FolderProbe& operator=(const FolderProbe&) = delete;
  const std::string& name() const { return name_; }
  /// Whether another rank's probe `name` is in `folder` ("" or "-": no).
  static bool seen(const std::string& folder, const std::string& name);

 private:
  std::string folder_, name_;
};
/// load_run of a save made on another number of ranks: the shards this rank's disk holds
/// (its own, or a buddy's replica) sent to every rank, each re-sharding them to its world as
/// reshard_run does, then loading its shard through load_file. A shard no rank holds: every rank
/// refuses naming it.
std::int64_t load_resharded(
    const std::string& path, const std::string& manifest, RankGroup& ranks,
    const std::function<std::int64_t(const std::string&, const AgreeFn&)>& load_file);

}  // namespace ampactor::internal
