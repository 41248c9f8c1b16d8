// Sharded run checkpoints: the manifest, the shard files' digests, and save_run / load_run as
// collectives in which every rank agrees before a manifest is published or a shard loaded.
#include "internal/sharded_run.h"
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/run/run.h>
#include <ampactor/scaler/ranks.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace ampactor {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, why);
}

}  // namespace

namespace internal {

std::vector<std::string> gather_strings(RankGroup& ranks, const std::string& mine) {
  const int world = ranks.size();
  at::Tensor len = at::empty({8}, at::kByte), lens = at::empty({8 * world}, at::kByte);
  const std::uint64_t n = mine.size();
  std::memcpy(len.data_ptr(), &n, 8);
  ranks.all_gather(len, lens);
  std::vector<std::uint64_t> sizes(std::size_t(world), 0);
  std::memcpy(sizes.data(), lens.data_ptr(), 8 * std::size_t(world));
  std::uint64_t most = 1;
  for (std::uint64_t s : sizes)
    most = std::max(most, s);
  at::Tensor buf = at::zeros({std::int64_t(most)}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({std::int64_t(most) * world}, at::kByte);
  ranks.all_gather(buf, all);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r)
    out.emplace_back(static_cast<const char*>(all.data_ptr()) + most * std::uint64_t(r),
                     sizes[std::size_t(r)]);
  return out;
}

void agree(RankGroup& ranks, const std::string& error,
           const std::function<std::string(int)>& what) {
  const std::vector<std::string> all = gather_strings(ranks, error);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) refuse(what(int(r)) + ": " + all[r]);
}

namespace {

/// This rank's shard files of earlier saves at the same path (BASE.step<K>.rank<R>-of-<N>, K
/// not `step`): the published manifest no longer names them. POSIX calls, not std::filesystem's
/// iterator: a PyTorch wheel's libtorch_cpu.so exports its own copies of those, which crash when
/// bound to code built with another GCC.
void remove_older(const std::string& path, std::int64_t step, int rank, int world) {
  const std::string base = fs::path(path).filename().string(), head = base + ".step",
                    tail = ".rank" + std::to_string(rank) + "-of-" + std::to_string(world);
  const std::string folder = folder_of(path);
  DIR* d = ::opendir(folder.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() <= head.size() + tail.size() || n.compare(0, head.size(), head) != 0 ||
        n.compare(n.size() - tail.size(), tail.size(), tail) != 0 ||
        n == shard_name(base, step, rank, world))
      continue;
    const std::string k = n.substr(head.size(), n.size() - head.size() - tail.size());
    if (k.find_first_not_of("0123456789") == std::string::npos) stale.push_back(n);
  }
  ::closedir(d);
  for (const std::string& n : stale)
    ::unlink((folder + "/" + n).c_str());
}

}  // namespace

namespace {

/// One rank's shard as the others hear of it: "DIGEST BYTES PROBE HOST".
struct Entry {
  std::string digest, probe, host;
  std::uint64_t bytes = 0;
};

[[noreturn]] void refuse_write(const std::string& path, const std::string& what, int r,
                               const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, "save_run '" + path + "': rank " + std::to_string(r) +
                                              " could not write " + what +
                                              ", so no manifest was written: " + why);
}

/// Each shard's digest and size, its rank's probe and host (for the replicas' buddies), or why
/// the rank has none (refused on every rank): one round for all, each entry read once.
std::vector<Entry> gather_entries(RankGroup& ranks, const std::string& path,
                                  const std::string& error, const std::string& digest,
                                  std::size_t bytes, const FolderProbe& probe) {
  const std::vector<std::string> entries = gather_strings(
      ranks, error.empty() ? digest + " " + std::to_string(bytes) + " " +
                                 (probe.name().empty() ? "-" : probe.name()) + " " + host_name()
                           : std::string(1, '\0') + error);
  for (std::size_t r = 0; r < entries.size(); ++r)
    if (!entries[r].empty() && entries[r][0] == '\0')
      refuse_write(path, "its shard", int(r), entries[r].substr(1));
  std::vector<Entry> shards(entries.size());
  for (std::size_t r = 0; r < entries.size(); ++r) {
    std::istringstream in(entries[r]);
    in >> shards[r].digest >> shards[r].bytes >> shards[r].probe >> std::ws;
    std::getline(in, shards[r].host);  // the host last: the rest of the line
  }
  return shards;
}

/// This rank's shard into its own file, flushed, while a copy goes to its buddy on another host
/// (so that one lost host loses no shard) and the shard of the rank `by` before it arrives here
/// (into `replica_file` where `replica_here`). `error`: this rank's, so far. Both writes' errors
/// are agreed in one round, refused on every rank.
void write_shards(RankGroup& ranks, const std::string& path, const std::string& shard,
                  const std::string& file, int by, const std::string& replica_file,
                  std::uint64_t replica_bytes, bool replica_here, std::string error) {
  std::string replica_error;
  {
    std::thread writer([&] {
      try {
        save_text_atomically(shard, file);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    struct Join {
      std::thread& t;
      ~Join() { t.join(); }
    } join{writer};
    if (by)
      replica_error =
          exchange_replicas(ranks, by, shard, replica_file, replica_bytes, replica_here);
  }
  // "W" + its shard's, "R" + its buddy's.
  const std::vector<std::string> written =
      gather_strings(ranks, !error.empty()           ? "W" + error
                            : !replica_error.empty() ? "R" + replica_error
                                                     : "");
  for (std::size_t r = 0; r < written.size(); ++r)
    if (!written[r].empty())
      refuse_write(path, written[r][0] == 'W' ? "its shard" : "its buddy's shard", int(r),
                   written[r].substr(1));
}

/// The manifest naming every rank's shard: rank 0's flushed; another host's is its replica, as
/// its buddy's shard is. Returns the error, or "".
std::string write_manifest(const std::string& path, const AsyncOptimizer& pipe,
                           const std::vector<Entry>& shards, std::int64_t step, int rank) {
  const int world = int(shards.size());
  const std::string base = fs::path(path).filename().string();
  ShardManifest m;
  const ShardLayout& layout = RunAccess::layout(pipe);
  m.step = step;
  m.numels = layout.numels();
  m.world = world;
  m.granule = layout.granule();
  m.shapes = RunAccess::shapes(pipe);
  for (int r = 0; r < world; ++r) {
    ShardManifest::Shard s;
    s.rank = r;
    s.file = shard_name(base, step, r, world);
    s.digest = shards[std::size_t(r)].digest;
    s.bytes = shards[std::size_t(r)].bytes;
    m.shards.push_back(s);
  }
  try {
    const std::string json = m.to_json();
    if (rank == 0)
      save_text_atomically(json, path);
    else
      write_unflushed(json.data(), json.size(), path);
  } catch (const ScalerError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

void save_sharded_run(const std::string& path, const RunParts& parts, std::int64_t step,
                      const std::function<std::string()>& run_bytes) {
  const AsyncOptimizer& pipe = *parts.pipeline();
  RankGroup& ranks = RunAccess::ranks(pipe);
  const int rank = ranks.rank(), world = ranks.size();
  const std::string base = fs::path(path).filename().string();
  if (base.empty() || base == "." || base == "..")
    throw ScalerError(errc::bad_option, "save_run: '" + path + "' names no file");
  const std::string folder = folder_of(path);
  const std::string file = (fs::path(folder) / shard_name(base, step, rank, world)).string();
  // Each rank writes its shard; then, once all have, rank 0 the manifest that names them all.
  std::string error, digest, shard;
  try {
    shard = run_bytes();
    digest = bytes_digest(shard.data(), shard.size());
  } catch (const std::exception& e) {  // any: the other ranks must hear of it, not wait
    error = e.what();
  }
  const FolderProbe probe(folder, base, rank);
  const std::vector<Entry> shards = gather_entries(ranks, path, error, digest, shard.size(), probe);
  std::vector<std::string> hosts;
  for (const Entry& e : shards)
    hosts.push_back(e.host);
  const Replicas rep = plan_replicas(hosts, rank, RunAccess::replicas(pipe));
  const int from = (rank - rep.by + world) % world;
  // A folder this rank shares with its buddy's rank, or with rank 0, already holds that rank's
  // shard or manifest, flushed: no replica replaces it.
  const bool replica_here = rep.by && !FolderProbe::seen(folder, shards[std::size_t(from)].probe);
  const bool manifest_here =
      rank == 0 || (rep.writes_manifest && !FolderProbe::seen(folder, shards[0].probe));
  write_shards(ranks, path, shard, file, rep.by,
               (fs::path(folder) / shard_name(base, step, from, world)).string(),
               shards[std::size_t(from)].bytes, replica_here, error);
  const std::string manifest_error =
      manifest_here ? write_manifest(path, pipe, shards, step, rank) : "";
  agree(ranks, manifest_error, [&](int r) {
    return "save_run: rank " + std::to_string(r) + " could not write the manifest '" + path + "'";
  });
  remove_older(path, step, rank, world);
  if (replica_here) remove_older(path, step, from, world);
}

std::int64_t load_sharded_run(
    const std::string& path, const RunParts& parts,
    const std::function<std::int64_t(const std::string&, const AgreeFn&)>& load_file) {
  const AsyncOptimizer& pipe = *parts.pipeline();
  RankGroup& ranks = RunAccess::ranks(pipe);
  const int rank = ranks.rank(), world = ranks.size();
  // Its steps done and its weights gathered first (a collective), so that no rank's refusal
  // below leaves the others in it.
  parts.pipeline()->sync();
  // Rank 0 reads the manifest and every rank gets its text (other ranks' disks may have none).
  std::string text;
  if (rank == 0) try {
      text = manifest_text(path);
      parse_manifest(text, path);  // its checks here, so that every rank's error is rank 0's
    } catch (const ScalerError& e) {
      text = std::string(1, '\0') + e.what();
    }
  text = gather_strings(ranks, text)[0];
  if (!text.empty() && text[0] == '\0') refuse("load_run: " + text.substr(1));
  const ShardManifest m = parse_manifest(text, path);
  const ShardLayout& layout = RunAccess::layout(pipe);
  if (m.world != world) {
    if (m.numels != layout.numels() || m.granule != layout.granule() ||
        m.shapes != RunAccess::shapes(pipe))
      refuse("load_run: '" + path + "' holds another model's shards (" + m.layout().str() +
             "), this pipeline's are " + layout.str());
    // Saved on another number of ranks (a restart with fewer, after a lost host): re-sharded.
    return load_resharded(path, text, ranks, load_file);
  }
  if (m.layout() != layout || m.shapes != RunAccess::shapes(pipe))
    refuse("load_run: '" + path + "' holds another model's shards (" + m.layout().str() +
           "), this pipeline's are " + layout.str());
  const AgreeFn agreed = [&](const std::string& error, std::int64_t step, const std::string&) {
    // Every rank's shard of the manifest's save: whole shards of two saves are not one run.
    agree(ranks, error.empty() ? step_problem(m, path, rank, step) : error, [&](int r) {
      return "load_run '" + path + "': rank " + std::to_string(r) +
             " refused its shard, so no rank loaded";
    });
  };
  if (const std::string p = shard_problem(m, path, rank); !p.empty()) agreed(p, -1, "");  // throws
  return load_file(m.shard_path(path, rank), agreed);
}

}  // namespace internal
}  // namespace ampactor
