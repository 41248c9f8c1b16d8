// The files of a sharded run as ampactor's own libraries read and write them: the shard files'
// names, the manifest's text and checks, the digest of bytes in memory. Not an API: the run
// library's save_run and load_run and this library's tools share them.
#pragma once

#include <ampactor/checkpoint/sharded_checkpoint.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampactor {
class ShardLayout;
}  // namespace ampactor

namespace ampactor::internal {

/// Rank r's shard file of a save at `step` to BASE (the manifest's file name):
/// "BASE.step<K>.rank<R>-of-<N>".
std::string shard_name(const std::string& base, std::int64_t step, int rank, int world);

/// What a sharded pipeline's save() records as its shard (AsyncOptimizer::shard_text).
std::string shard_text(int rank, const ShardLayout& layout);

/// The manifest in `text` (read from `path`), checked for form.
ShardManifest parse_manifest(const std::string& text, const std::string& path);
/// The most bytes a manifest is read to: a parameter's entry takes tens of bytes, so a million
/// parameters fit; a larger "manifest" (a link to a huge file, say) is refused, not read whole.
inline constexpr std::uint64_t kManifestLimit = std::uint64_t(64) << 20;
/// The text of the manifest at `path` (a regular file of at most kManifestLimit bytes); anything
/// but a manifest refused.
std::string manifest_text(const std::string& path);
/// "" if rank r's shard file is beside `path` with the size and digest recorded, else what
/// differs.
std::string shard_problem(const ShardManifest& m, const std::string& path, int r);
/// The step a shard file (a run file) holds.
std::int64_t shard_step(const std::string& file);
/// "" if rank r's shard holds the manifest's step `step`, else what differs.
std::string step_problem(const ShardManifest& m, const std::string& path, int r, std::int64_t step);
/// The folder of `path` ("." for a bare name).
std::string folder_of(const std::string& path);

/// file_digest's digest of `n` bytes in memory.
std::string bytes_digest(const char* data, std::size_t n);

}  // namespace ampactor::internal
