// Checks a LibTorch archive's bytes before LibTorch reads them. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ampactor::internal {

/// CRC-32 as zip computes it.
std::uint32_t crc32(const void* data, std::size_t n);

/// A record's name as an error message shows it: bytes outside printable ASCII escaped.
std::string shown(const std::string& name);

/// One entry of a checked archive: its name and where its bytes are, as LibTorch's reader (miniz)
/// finds them. A stored entry's `size` bytes at `data_at` are its content, CRC checked; a deflated
/// one's `stored` bytes there inflate to `size` bytes whose CRC-32 must be `crc`, which is for
/// the caller to check.
struct ZipEntry {
  std::string name;
  std::uint64_t data_at = 0, size = 0;
  bool deflated = false;
  std::uint64_t stored = 0;
  std::uint32_t crc = 0;
};

/// What is wrong with the zip archive in `data` (truncated, a broken directory, a stored entry
/// whose bytes do not match its CRC-32, anything laid out otherwise than LibTorch's writer lays it
/// out), or an empty string when nothing is. When nothing is, `entries` (if given) receives the
/// entries in the directory's order.
std::string zip_damage(const void* data, std::size_t size,
                       std::vector<ZipEntry>* entries = nullptr);

}  // namespace ampactor::internal
