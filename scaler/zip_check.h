// Checks a LibTorch archive's bytes before LibTorch reads them. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampactor::internal {

/// CRC-32 as zip computes it.
std::uint32_t crc32(const void* data, std::size_t n);

/// What is wrong with the zip archive in `data` (truncated, a broken directory, an entry whose
/// bytes do not match its CRC-32), or an empty string when nothing is.
std::string zip_damage(const void* data, std::size_t size);

}  // namespace ampactor::internal
