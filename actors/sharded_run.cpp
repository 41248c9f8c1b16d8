// Sharded run checkpoints: the manifest, the shard files' digests, and save_run / load_run as
// collectives in which every rank agrees before a manifest is published or a shard loaded.
#include "internal/sharded_run.h"
#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include <ampactor/scaler/ranks.h>
#include "internal/shard_state.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace ampactor {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, why);
}

}  // namespace

std::string internal::folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

using internal::folder_of;

std::string ShardManifest::shard_path(const std::string& manifest_path, int rank) const {
  return (fs::path(folder_of(manifest_path)) / shards.at(std::size_t(rank)).file).string();
}

std::string ShardManifest::to_json() const {
  nlohmann::ordered_json j;
  j["ampactor"] = "sharded checkpoint";
  j["version"] = 1;
  j["step"] = step;
  j["world"] = world;
  j["granule"] = granule;
  j["numels"] = numels;
  j["shapes"] = shapes;
  for (const Shard& s : shards)
    j["shards"].push_back(
        {{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes}, {"digest", s.digest}});
  return j.dump(1) + "\n";
}

bool is_manifest(const std::string& path) {
  // Only a regular file can be one: a FIFO or a device is never opened blocking or read whole.
  std::uint64_t size = 0;
  int fd = -1;
  try {
    fd = open_regular_file(path, "file", &size);
  } catch (const ScalerError&) {
    return false;
  }
  char buf[4096];
  ssize_t n = 0, i = 0;
  while (i == n && (n = ::read(fd, buf, sizeof buf)) > 0)
    for (i = 0; i < n && std::isspace(static_cast<unsigned char>(buf[i]));)
      ++i;
  ::close(fd);
  return n > 0 && i < n && buf[i] == '{';
}

namespace internal {

/// The manifest in `text` (read from `path`), checked for form.
ShardManifest parse_manifest(const std::string& text, const std::string& path) {
  ShardManifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("ampactor", "") != "sharded checkpoint" || j.value("version", 0) != 1)
      refuse("'" + path + "' is not a version-1 ampactor sharded checkpoint manifest");
    m.step = j.at("step").get<std::int64_t>();
    m.world = j.at("world").get<int>();
    m.granule = j.at("granule").get<std::int64_t>();
    m.numels = j.at("numels").get<std::vector<std::int64_t>>();
    m.shapes = j.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
    for (const auto& s : j.at("shards"))
      m.shards.push_back({s.at("rank").get<int>(), s.at("file").get<std::string>(),
                          s.at("bytes").get<std::uint64_t>(), s.at("digest").get<std::string>()});
    (void)m.layout();  // the layout's own checks (world, granule, sizes)
  } catch (const nlohmann::json::exception& e) {
    refuse("the manifest '" + path + "' is malformed: " + e.what());
  } catch (const ScalerError& e) {
    refuse("the manifest '" + path + "': " + e.what());
  }
  if (m.shards.size() != std::size_t(m.world))
    refuse("the manifest '" + path + "' names " + std::to_string(m.shards.size()) +
           " shards for world " + std::to_string(m.world));
  if (m.shapes.size() != m.numels.size())
    refuse("the manifest '" + path + "' has " + std::to_string(m.shapes.size()) + " shapes for " +
           std::to_string(m.numels.size()) + " parameters");
  for (std::size_t i = 0; i < m.shapes.size(); ++i) {
    std::int64_t n = 1;
    for (std::int64_t d : m.shapes[i]) {
      // Two negative sizes would multiply to the right count.
      if (d < 0 || (d > 0 && n > std::numeric_limits<std::int64_t>::max() / d))
        refuse("the manifest '" + path + "': parameter " + std::to_string(i) + "'s shape has a " +
               (d < 0 ? "negative size " + std::to_string(d) : "size product beyond int64"));
      n *= d;
    }
    if (n != m.numels[i])
      refuse("the manifest '" + path + "': parameter " + std::to_string(i) + "'s shape holds " +
             std::to_string(n) + " elements, the layout " + std::to_string(m.numels[i]));
  }
  for (int r = 0; r < m.world; ++r) {
    const std::string& f = m.shards[std::size_t(r)].file;
    if (m.shards[std::size_t(r)].rank != r || f.empty() || f.find('/') != std::string::npos)
      refuse("the manifest '" + path + "': entry " + std::to_string(r) + " is not rank " +
             std::to_string(r) + "'s shard file in the manifest's folder");
  }
  return m;
}

}  // namespace internal

/// The text of the manifest at `path`, read once; anything but a manifest refused.
std::string internal::manifest_text(const std::string& path) {
  const std::string text = read_regular_file(path, "the manifest", kManifestLimit);
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{')
    refuse("'" + path +
           "' is not a sharded run's manifest (an ordinary checkpoint? ampactor-ckpt reshard "
           "makes a sharded run of one)");
  return text;
}

ShardManifest read_manifest(const std::string& path) {
  return internal::parse_manifest(internal::manifest_text(path), path);
}

namespace internal {

/// "" if rank r's shard file is there with the size and digest recorded, else what differs.
std::string shard_problem(const ShardManifest& m, const std::string& path, int r) {
  const ShardManifest::Shard& s = m.shards[std::size_t(r)];
  const std::string f = m.shard_path(path, r);
  std::error_code ec;
  if (!fs::exists(f, ec))
    return "its shard file '" + f + "' is missing (the manifest names it for step " +
           std::to_string(m.step) + ")";
  std::uint64_t bytes = 0;
  std::string d;
  try {
    // Its size first: a file of another size is not read at all.
    ::close(open_regular_file(f, "the shard file", &bytes));
    if (bytes == s.bytes) d = file_digest(f, &bytes);
  } catch (const ScalerError& e) {
    return e.what();
  }
  if (bytes != s.bytes)
    return "its shard file '" + f + "' holds " + std::to_string(bytes) + " bytes, the manifest " +
           std::to_string(s.bytes) + " (another save's, or damaged)";
  if (d != s.digest)
    return "its shard file '" + f + "' has digest " + d + ", the manifest " + s.digest +
           " (another save's, or damaged)";
  return "";
}

}  // namespace internal

ShardManifest check_sharded_run(const std::string& path) {
  ShardManifest m = read_manifest(path);
  for (int r = 0; r < m.world; ++r)
    if (const std::string p = internal::shard_problem(m, path, r); !p.empty())
      refuse("sharded checkpoint '" + path + "': rank " + std::to_string(r) + ": " + p);
  return m;
}

namespace internal {

bool RunAccess::sharded(const AsyncOptimizer& pipe) {
  return pipe.shard_ != nullptr;
}
RankGroup& RunAccess::ranks(const AsyncOptimizer& pipe) {
  return pipe.shard_->ranks();
}
const ShardLayout& RunAccess::layout(const AsyncOptimizer& pipe) {
  return pipe.shard_->layout();
}
std::vector<std::vector<std::int64_t>> RunAccess::shapes(const AsyncOptimizer& pipe) {
  std::vector<std::vector<std::int64_t>> s;
  for (const at::Tensor& p : pipe.model_)
    s.emplace_back(p.sizes().begin(), p.sizes().end());
  return s;
}

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

std::string shard_text(int rank, const ShardLayout& layout) {
  return "rank " + std::to_string(rank) + "'s shard (" + layout.str() + ")";
}

std::string shard_name(const std::string& base, std::int64_t step, int rank, int world) {
  return base + ".step" + std::to_string(step) + ".rank" + std::to_string(rank) + "-of-" +
         std::to_string(world);
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

void save_sharded_run(const std::string& path, const RunParts& parts, std::int64_t step,
                      const std::function<std::string()>& run_bytes) {
  const AsyncOptimizer& pipe = *parts.pipeline();
  RankGroup& ranks = RunAccess::ranks(pipe);
  const int rank = ranks.rank(), world = ranks.size();
  const std::string base = fs::path(path).filename().string();
  if (base.empty() || base == "." || base == "..")
    throw ScalerError(errc::bad_option, "save_run: '" + path + "' names no file");
  const std::string file =
      (fs::path(folder_of(path)) / shard_name(base, step, rank, world)).string();
  // Each rank writes its shard; then, once all have, rank 0 the manifest that names them all.
  std::string error, digest, shard;
  try {
    shard = run_bytes();
    digest = bytes_digest(shard.data(), shard.size());
  } catch (const std::exception& e) {  // any: the other ranks must hear of it, not wait
    error = e.what();
  }
  const auto refuse_write = [&](const std::string& what, int r, const std::string& why) {
    throw ScalerError(errc::bad_checkpoint, "save_run '" + path + "': rank " + std::to_string(r) +
                                                " could not write " + what +
                                                ", so no manifest was written: " + why);
  };
  // Each shard's digest and size and its rank's host (for the replicas' buddies), or why the
  // rank has none: one round for both.
  const std::vector<std::string> entries = gather_strings(
      ranks, error.empty() ? digest + " " + std::to_string(shard.size()) + " " + host_name()
                           : std::string(1, '\0') + error);
  for (std::size_t r = 0; r < entries.size(); ++r)
    if (!entries[r].empty() && entries[r][0] == '\0')
      refuse_write("its shard", int(r), entries[r].substr(1));
  std::vector<std::string> hosts;
  for (const std::string& e : entries)
    hosts.push_back(e.substr(e.find(' ', e.find(' ') + 1) + 1));
  const Replicas rep = plan_replicas(hosts, rank, RunAccess::replicas(pipe));
  const int from = (rank - rep.by + world) % world;
  // The shard's own file, flushed, while a copy goes to the buddy on another host (so that one
  // lost host loses no shard).
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
    if (rep.by) {
      const std::string& of = entries[std::size_t(from)];
      replica_error = exchange_replicas(
          ranks, rep.by, shard,
          (fs::path(folder_of(path)) / shard_name(base, step, from, world)).string(),
          of.substr(0, of.find(' ')));
    }
  }
  // Both writes' errors in one round: "W" + its shard's, "R" + its buddy's.
  const std::vector<std::string> written =
      gather_strings(ranks, !error.empty()           ? "W" + error
                            : !replica_error.empty() ? "R" + replica_error
                                                     : "");
  for (std::size_t r = 0; r < written.size(); ++r)
    if (!written[r].empty())
      refuse_write(written[r][0] == 'W' ? "its shard" : "its buddy's shard", int(r),
                   written[r].substr(1));
  std::string manifest_error;
  if (rank == 0 || rep.writes_manifest) {
    ShardManifest m;
    const ShardLayout& layout = RunAccess::layout(pipe);
    m.step = step;
    m.numels = layout.numels();
    m.world = world;
    m.granule = layout.granule();
    m.shapes = RunAccess::shapes(pipe);
    for (int r = 0; r < world; ++r) {
      std::istringstream in(entries[std::size_t(r)]);
      ShardManifest::Shard s;
      s.rank = r;
      s.file = shard_name(base, step, r, world);
      in >> s.digest >> s.bytes;
      m.shards.push_back(s);
    }
    try {
      save_text_atomically(m.to_json(), path);
    } catch (const ScalerError& e) {
      manifest_error = e.what();
    }
  }
  agree(ranks, manifest_error, [&](int r) {
    return "save_run: rank " + std::to_string(r) + " could not write the manifest '" + path + "'";
  });
  remove_older(path, step, rank, world);
  if (rep.by) remove_older(path, step, from, world);
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
  const AgreeFn agreed = [&](const std::string& error, std::int64_t, const std::string&) {
    agree(ranks, error, [&](int r) {
      return "load_run '" + path + "': rank " + std::to_string(r) +
             " refused its shard, so no rank loaded";
    });
  };
  if (const std::string p = shard_problem(m, path, rank); !p.empty()) agreed(p, -1, "");  // throws
  return load_file(m.shard_path(path, rank), agreed);
}

}  // namespace internal
}  // namespace ampactor
