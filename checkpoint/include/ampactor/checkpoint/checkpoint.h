// Checkpoints the LibTorch way: the scaler goes into a torch::serialize::OutputArchive beside the
// model and the optimizer (torch::save(scaler, path) works too, with <torch/serialize.h>), and
// checkpoint files are written so that a crash never leaves a half-written one where the last
// good one was. Only declarations here: the archives' headers are heavy and stay in one .cpp.
//
// Python interop: read_torch_state_dict reads what torch.save(scaler.state_dict(), path) wrote,
// write_torch_state_dict writes what torch.load(path) reads and GradScaler.load_state_dict takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ampactor/core/state_dict.h>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ampactor {

class LocalGradScaler;

/// The state_dict's entries as entries of `archive` (torch's keys; a float as a double, an int
/// as an int).
void write_state_dict(const StateDict& sd, torch::serialize::OutputArchive& archive);
/// The state_dict written by write_state_dict: torch's five keys, each read if present (a
/// missing one is missing from the result, for load_state_dict to name).
StateDict read_state_dict(torch::serialize::InputArchive& archive);

/// Writes `archive` to `path` atomically: into a temporary file beside it, flushed to the disk,
/// then renamed over `path`, so `path` holds either the old file or the new one, whole, whatever
/// kills the process when. Throws ScalerError(errc::bad_checkpoint) naming the path on any I/O
/// error (the temporary file is removed and `path` left as it was).
void save_atomically(torch::serialize::OutputArchive& archive, const std::string& path);
/// Writes `text` to `path` as save_atomically writes an archive (a manifest, say).
void save_text_atomically(const std::string& text, const std::string& path);
/// Reads the checkpoint at `path` into `archive`. A missing, truncated or corrupt file throws
/// ScalerError(errc::bad_checkpoint) naming the path and what is wrong.
void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path);
/// As load_checkpoint, from `size` bytes in memory (a checkpoint received over a network, say);
/// `name` stands for the path in errors. The bytes are read, never kept.
void load_checkpoint(torch::serialize::InputArchive& archive, const char* data, std::size_t size,
                     const std::string& name);

/// The bytes of the regular file at `path` (links followed), at most `limit` of them. Anything
/// else (a directory, a FIFO, a device such as /dev/zero), a larger file, or one that cannot be
/// read throws ScalerError(errc::bad_checkpoint) naming `what` and the path; a FIFO never blocks.
std::string read_regular_file(const std::string& path, const std::string& what,
                              std::uint64_t limit = UINT64_MAX);
/// The regular file at `path`, opened for reading (its descriptor, the caller's to close), and
/// its size in `size`; throws as read_regular_file.
int open_regular_file(const std::string& path, const std::string& what, std::uint64_t* size);

/// The GradScaler state_dict in a file written by PyTorch's torch.save(scaler.state_dict(), f).
/// A file that is not such a dict: ScalerError(errc::bad_checkpoint).
StateDict read_torch_state_dict(const std::string& path);
/// As read_torch_state_dict, from `size` bytes in memory; `name` stands for the path in errors.
StateDict read_torch_state_dict(const char* data, std::size_t size, const std::string& name);
/// Writes `sd` as torch.save(state_dict, path) would (atomically, as save_atomically).
void write_torch_state_dict(const StateDict& sd, const std::string& path);

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const LocalGradScaler& scaler);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           LocalGradScaler& scaler);

}  // namespace ampactor
