// Integrity of LibTorch's archives. A torch archive is a zip whose entries are stored
// uncompressed, each with its CRC-32 in the central directory; LibTorch writes the CRCs but does
// not check them when reading, so a flipped byte in a tensor loads silently as a wrong value. This
// walks the directory (zip64 included) and checks every stored entry's CRC.
#include "zip_check.h"

#include <array>
#include <cstring>

namespace ampactor::internal {

namespace {

/// CRC-32 (IEEE, reflected, as zip uses), slicing by 8 bytes.
class Crc32 {
 public:
  Crc32() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t_[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s)
        t_[s][i] = (t_[s - 1][i] >> 8) ^ t_[0][t_[s - 1][i] & 0xFF];
  }
  std::uint32_t operator()(const unsigned char* p, std::size_t n) const {
    std::uint32_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
      const std::uint32_t lo = c ^ (p[0] | p[1] << 8 | p[2] << 16 | std::uint32_t(p[3]) << 24);
      c = t_[7][lo & 0xFF] ^ t_[6][(lo >> 8) & 0xFF] ^ t_[5][(lo >> 16) & 0xFF] ^ t_[4][lo >> 24] ^
          t_[3][p[4]] ^ t_[2][p[5]] ^ t_[1][p[6]] ^ t_[0][p[7]];
    }
    for (; n > 0; ++p, --n)
      c = t_[0][(c ^ *p) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
  }

 private:
  std::array<std::array<std::uint32_t, 256>, 8> t_{};
};

struct Reader {
  const unsigned char* d;
  std::size_t n;
  bool has(std::uint64_t at, std::uint64_t len) const { return at <= n && len <= n - at; }
  std::uint64_t le(std::uint64_t at, int bytes) const {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = v << 8 | d[at + i];
    return v;
  }
};

}  // namespace

std::uint32_t crc32(const void* data, std::size_t n) {
  static const Crc32 crc;
  return crc(static_cast<const unsigned char*>(data), n);
}

std::string zip_damage(const void* data, std::size_t size) {
  const Reader r{static_cast<const unsigned char*>(data), size};
  // The end-of-directory record: the last one, within a comment's length of the end.
  if (size < 22) return "shorter than any zip archive";
  std::uint64_t eocd = size - 22;
  const std::uint64_t stop = size > 22 + 65535 ? size - 22 - 65535 : 0;
  while (r.le(eocd, 4) != 0x06054b50) {
    if (eocd == stop) return "no zip directory at its end (truncated?)";
    --eocd;
  }
  std::uint64_t entries = r.le(eocd + 10, 2), dir_size = r.le(eocd + 12, 4),
                dir_at = r.le(eocd + 16, 4);
  if (entries == 0xFFFF || dir_size == 0xFFFFFFFF || dir_at == 0xFFFFFFFF) {
    // zip64: a locator right before the record points at the 64-bit one.
    if (eocd < 20 || r.le(eocd - 20, 4) != 0x07064b50) return "a zip64 archive without locator";
    const std::uint64_t z = r.le(eocd - 12, 8);
    if (!r.has(z, 56) || r.le(z, 4) != 0x06064b50) return "a broken zip64 directory record";
    entries = r.le(z + 32, 8), dir_size = r.le(z + 40, 8), dir_at = r.le(z + 48, 8);
  }
  if (!r.has(dir_at, dir_size)) return "its zip directory lies outside the file (truncated?)";
  std::uint64_t at = dir_at;
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (!r.has(at, 46) || r.le(at, 4) != 0x02014b50) return "a broken zip directory entry";
    const std::uint64_t method = r.le(at + 10, 2), crc = r.le(at + 16, 4);
    std::uint64_t csize = r.le(at + 20, 4), usize = r.le(at + 24, 4), local = r.le(at + 42, 4);
    const std::uint64_t name_len = r.le(at + 28, 2), extra_len = r.le(at + 30, 2),
                        comment_len = r.le(at + 32, 2);
    if (!r.has(at + 46, name_len + extra_len + comment_len)) return "a broken zip directory entry";
    const std::string name(reinterpret_cast<const char*>(r.d + at + 46), name_len);
    // zip64 sizes and offset, in this order, for the fields that are all ones.
    for (std::uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const std::uint64_t id = r.le(x, 2), len = r.le(x + 2, 2);
      std::uint64_t f = x + 4;
      if (id == 0x0001) {
        if (usize == 0xFFFFFFFF && f + 8 <= x + 4 + len) usize = r.le(f, 8), f += 8;
        if (csize == 0xFFFFFFFF && f + 8 <= x + 4 + len) csize = r.le(f, 8), f += 8;
        if (local == 0xFFFFFFFF && f + 8 <= x + 4 + len) local = r.le(f, 8);
      }
      x += 4 + len;
    }
    if (!r.has(local, 30) || r.le(local, 4) != 0x04034b50)
      return "entry '" + name + "': its data lies outside the file (truncated?)";
    const std::uint64_t start = local + 30 + r.le(local + 26, 2) + r.le(local + 28, 2);
    if (!r.has(start, csize)) return "entry '" + name + "' is cut short (truncated?)";
    if (method == 0) {  // stored: the CRC covers these bytes as they are
      if (usize != csize) return "entry '" + name + "': sizes disagree";
      if (crc32(r.d + start, csize) != crc)
        return "entry '" + name + "' does not match its checksum (the file is corrupt)";
    }
    at += 46 + name_len + extra_len + comment_len;
  }
  return {};
}

}  // namespace ampactor::internal
