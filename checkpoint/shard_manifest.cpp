// A sharded run's manifest: its JSON, its checks, and each shard file's checks against it
// (size, digest, step), for load_run, ampactor-ckpt check and the re-shard.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include "internal/sharded_files.h"

#include <torch/serialize/input-archive.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <limits>

namespace fs = std::filesystem;

namespace ampactor {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, why);
}

}  // namespace

std::string internal::shard_text(int rank, const ShardLayout& layout) {
  return "rank " + std::to_string(rank) + "'s shard (" + layout.str() + ")";
}

std::string internal::shard_name(const std::string& base, std::int64_t step, int rank, int world) {
  return base + ".step" + std::to_string(step) + ".rank" + std::to_string(rank) + "-of-" +
         std::to_string(world);
}

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

std::int64_t shard_step(const std::string& file) {
  torch::serialize::InputArchive all;
  load_checkpoint(all, file);
  c10::IValue step;
  if (!all.try_read("step", step) || !step.isInt()) refuse("'" + file + "' holds no step");
  return step.toInt();
}

std::string step_problem(const ShardManifest& m, const std::string& path, int r,
                         std::int64_t step) {
  if (step == m.step) return "";
  return "its shard file '" + m.shard_path(path, r) + "' holds step " + std::to_string(step) +
         ", the manifest step " + std::to_string(m.step) +
         " (a manifest naming another save's shard)";
}

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
  for (int r = 0; r < m.world; ++r) {
    std::string p = internal::shard_problem(m, path, r);
    // Whole shards of two saves, named by an edited or mixed manifest, are not one run.
    if (p.empty())
      p = internal::step_problem(m, path, r, internal::shard_step(m.shard_path(path, r)));
    if (!p.empty())
      refuse("sharded checkpoint '" + path + "': rank " + std::to_string(r) + ": " + p);
  }
  return m;
}

}  // namespace ampactor
