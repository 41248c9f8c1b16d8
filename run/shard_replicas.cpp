// A sharded run that survives a lost host: each rank's shard also kept by a buddy on another
// host, and a save loaded on another number of ranks re-sharded inside load_run.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include <ampactor/scaler/ranks.h>
#include "internal/sharded_run.h"

#include <ATen/ops/from_blob.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace ampactor::internal {
namespace {

/// The pieces a replica is received and written in: two of them stay in a core's cache.
constexpr std::int64_t kReplicaPiece = std::int64_t(1) << 20;

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, why);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) refuse("cannot open '" + path + "': " + std::strerror(errno));
  std::string bytes(std::size_t(in.tellg()), '\0');
  in.seekg(0);
  in.read(bytes.data(), std::streamsize(bytes.size()));
  if (!in) refuse("cannot read '" + path + "'");
  return bytes;
}

/// A folder of this rank's own beside `path`, removed with everything in it when done.
struct Scratch {
  std::string dir;
  explicit Scratch(const std::string& path, int rank) {
    std::string templ =
        (fs::path(folder_of(path)) /
         ("." + fs::path(path).filename().string() + ".reshard" + std::to_string(rank) + ".XXXXXX"))
            .string();
    if (!::mkdtemp(templ.data()))
      refuse("load_run '" + path +
             "': cannot make a folder to re-shard in beside it: " + std::strerror(errno));
    dir = templ;
  }
  /// Its files (it holds no folders), then itself: POSIX calls, not std::filesystem's iterator,
  /// which a PyTorch wheel's libtorch_cpu.so exports in copies that crash (as remove_older).
  ~Scratch() {
    if (DIR* d = ::opendir(dir.c_str())) {
      std::vector<std::string> names;
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          names.emplace_back(e->d_name);
      ::closedir(d);
      for (const std::string& n : names)
        ::unlink((dir + "/" + n).c_str());
    }
    ::rmdir(dir.c_str());
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

/// A file written whole or not at all (a temporary file renamed over `path` on commit, removed
/// if never committed), not flushed (see write_unflushed).
class Unflushed {
 public:
  explicit Unflushed(const std::string& path) : path_(path), tmp_(path + ".replica.XXXXXX") {
    fd_ = ::mkostemp(tmp_.data(), O_CLOEXEC);
    if (fd_ < 0) refuse("cannot create the replica '" + tmp_ + "': " + std::strerror(errno));
    ::fchmod(fd_, 0644);
  }
  void append(const char* data, std::size_t n) {
    for (std::size_t done = 0; done < n;) {
      const ssize_t w = ::write(fd_, data + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) refuse("cannot write the replica '" + path_ + "': " + std::strerror(errno));
      done += std::size_t(w);
    }
  }
  void commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0)
      refuse("cannot write the replica '" + path_ + "': " + std::strerror(errno));
    committed_ = true;
  }
  ~Unflushed() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  Unflushed(const Unflushed&) = delete;
  Unflushed& operator=(const Unflushed&) = delete;

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_unflushed(const char* data, std::size_t n, const std::string& path) {
  Unflushed file(path);
  file.append(data, n);
  file.commit();
}

FolderProbe::FolderProbe(const std::string& folder, const std::string& base, int rank)
    : folder_(folder) {
  char id[17];
  std::snprintf(id, sizeof id, "%016llx",
                static_cast<unsigned long long>(std::random_device()()) << 32 ^ ::getpid());
  const std::string name = "." + base + ".probe-" + std::to_string(rank) + "-" + id;
  const int fd = ::open((folder + "/" + name).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0 && ::close(fd) == 0) name_ = name;
}

FolderProbe::~FolderProbe() {
  if (!name_.empty()) ::unlink((folder_ + "/" + name_).c_str());
}

bool FolderProbe::seen(const std::string& folder, const std::string& name) {
  struct stat st {};
  return !name.empty() && name != "-" && name.find('/') == std::string::npos &&
         ::stat((folder + "/" + name).c_str(), &st) == 0;
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "";
}

Replicas plan_replicas(const std::vector<std::string>& hosts, int me, ShardReplicas mode) {
  Replicas r;
  const int n = int(hosts.size());
  if (mode == ShardReplicas::off || n < 2) return r;
  // The least shift that puts every rank's buddy on another host.
  for (int by = 1; by < n && !r.by; ++by) {
    bool all = true;
    for (int i = 0; i < n && all; ++i)
      all = hosts[std::size_t(i)] != hosts[std::size_t((i + by) % n)];
    if (all) r.by = by;
  }
  if (!r.by && mode == ShardReplicas::buddy) r.by = 1;  // one host: the next rank
  bool first_of_host = true;
  for (int i = 0; i < me; ++i)
    first_of_host = first_of_host && hosts[std::size_t(i)] != hosts[std::size_t(me)];
  r.writes_manifest = r.by && me != 0 && first_of_host && hosts[0] != hosts[std::size_t(me)];
  return r;
}

std::string exchange_replicas(RankGroup& ranks, int by, const std::string& mine,
                              const std::string& theirs, std::uint64_t expected_bytes, bool write) {
  const at::Tensor out =
      at::from_blob(const_cast<char*>(mine.data()), {std::int64_t(mine.size())}, at::kByte);
  // Written out piece by piece as it arrives, from buffers still in cache (one pass over 7 MB
  // received whole cost a replicated save about a tenth more). Its digest is checked where it
  // matters, when it is loaded, as every shard's is; here its length.
  std::optional<Unflushed> file;
  std::uint64_t got = 0;
  std::string error;
  ranks.shift_pieces(out, by, kReplicaPiece, [&](const char* data, std::size_t n) {
    got += n;
    if (!error.empty() || !write) return;
    try {
      if (!file) file.emplace(theirs);
      file->append(data, n);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (error.empty() && got != expected_bytes)
    error = "the replica '" + theirs + "' came as " + std::to_string(got) +
            " bytes, its rank's shard is " + std::to_string(expected_bytes);
  if (error.empty() && write) try {
      if (!file) file.emplace(theirs);
      file->commit();
    } catch (const std::exception& e) {
      error = e.what();
    }
  return error;
}

std::int64_t load_resharded(
    const std::string& path, const std::string& manifest, RankGroup& ranks,
    const std::function<std::int64_t(const std::string&, const AgreeFn&)>& load_file) {
  const ShardManifest m = parse_manifest(manifest, path);
  const int me = ranks.rank(), world = ranks.size();
  // Which of the save's shards this rank's disk holds, whole (its own, or a buddy's replica).
  std::string holds(std::size_t(m.world), '0');
  for (int r = 0; r < m.world; ++r)
    if (shard_problem(m, path, r).empty()) holds[std::size_t(r)] = '1';
  const std::vector<std::string> all = gather_strings(ranks, holds);
  std::vector<int> holder(std::size_t(m.world), -1);
  for (int r = 0; r < m.world; ++r)
    for (int q = 0; q < world && holder[std::size_t(r)] < 0; ++q)
      if (all[std::size_t(q)][std::size_t(r)] == '1') holder[std::size_t(r)] = q;
  for (int r = 0; r < m.world; ++r)
    if (holder[std::size_t(r)] < 0)
      refuse("load_run '" + path + "': the save at step " + std::to_string(m.step) +
             " was sharded over " + std::to_string(m.world) + " ranks, and rank " +
             std::to_string(r) + "'s shard is whole on none of these " + std::to_string(world) +
             " (" + shard_problem(m, path, r) +
             "): a lost host's shards survive only as replicas (shard_replicas)");
  // Every shard to every rank (its holder sends it), then each re-shards as reshard_run does:
  // the ranks' results are the same bytes.
  Scratch scratch(path, me);
  const std::string base = fs::path(path).filename().string();
  const std::string copy = (fs::path(scratch.dir) / base).string();
  std::string error;
  for (int r = 0; r < m.world; ++r) {
    std::string bytes;
    if (holder[std::size_t(r)] == me) try {
        bytes = read_file(m.shard_path(path, r));
      } catch (const std::exception& e) {
        error = e.what();
      }
    bytes = gather_strings(ranks, bytes)[std::size_t(holder[std::size_t(r)])];
    if (error.empty()) try {
        save_text_atomically(bytes, m.shard_path(copy, r));
      } catch (const std::exception& e) {
        error = e.what();
      }
  }
  const std::string resharded = (fs::path(scratch.dir) / "resharded").string();
  if (error.empty()) try {
      save_text_atomically(manifest, copy);
      reshard_run(copy, world, resharded);
    } catch (const std::exception& e) {
      error = e.what();
    }
  agree(ranks, error, [&](int r) {
    return "load_run '" + path + "': rank " + std::to_string(r) + " could not re-shard the save";
  });
  const ShardManifest n = read_manifest(resharded);
  return load_file(n.shard_path(resharded, me),
                   [&](const std::string& e, std::int64_t, const std::string&) {
                     agree(ranks, e, [&](int r) {
                       return "load_run '" + path + "': rank " + std::to_string(r) +
                              " refused its re-sharded shard, so no rank loaded";
                     });
                   });
}

}  // namespace ampactor::internal
