// Integrity of LibTorch's archives. A torch archive is a zip whose entries are stored
// uncompressed (code records deflated where that makes them smaller), each with its CRC-32;
// LibTorch writes the CRCs but does not check them when reading, so a flipped byte in a tensor
// loads silently as a wrong value. This walks the directory (zip64 included), checks every stored
// entry's CRC, and that LibTorch's reader (miniz) would read the very bytes checked: one layout,
// every copy of a value agreeing. A deflated entry's CRC is its inflated bytes': the caller checks
// it once LibTorch's reader has inflated them (see ZipEntry).
#include "zip_check.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <set>

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
  std::uint64_t le(std::uint64_t at, int bytes) const {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = v << 8 | d[at + i];
    return v;
  }
};

constexpr std::uint64_t kLocal = 0x04034b50, kCentral = 0x02014b50, kDescriptor = 0x08074b50,
                        kEnd = 0x06054b50, kZip64End = 0x06064b50, kLocator = 0x07064b50;
constexpr std::uint64_t kOnes16 = 0xFFFF, kOnes32 = 0xFFFFFFFF;
constexpr std::uint64_t kHasDescriptor = 1u << 3, kUtf8 = 1u << 11;

/// Where the zip64 field's data lies among the extra fields at [at, at + len). False if the
/// fields are malformed, repeat the zip64 one, or hold one LibTorch never writes (it pads local
/// headers with an "FB" field, so that the data is aligned).
struct Zip64Field {
  std::uint64_t at = 0, len = 0;
  bool found = false;
};
bool read_extras(const Reader& r, std::uint64_t at, std::uint64_t len, bool local, Zip64Field& z) {
  for (std::uint64_t x = at, end = at + len; x < end;) {
    if (end - x < 4) return false;
    const std::uint64_t id = r.le(x, 2), n = r.le(x + 2, 2);
    if (n > end - x - 4) return false;
    if (id == 0x0001) {
      if (z.found) return false;
      z = {x + 4, n, true};
    } else if (!local || id != 0x4246) {
      return false;
    }
    x += 4 + n;
  }
  return true;
}

/// The 64-bit values of the fields that are all ones, in the order given, from the zip64 field
/// (which must hold exactly those). False if it does not.
bool widen(const Reader& r, const Zip64Field& z, std::initializer_list<std::uint64_t*> fields) {
  std::uint64_t at = z.at, wide = 0;
  for (std::uint64_t* f : fields)
    wide += *f == kOnes32;
  if (!z.found) return wide == 0;
  if (z.len != 8 * wide || wide == 0) return false;
  for (std::uint64_t* f : fields)
    if (*f == kOnes32) *f = r.le(at, 8), at += 8;
  return true;
}

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

}  // namespace

std::uint32_t crc32(const void* data, std::size_t n) {
  static const Crc32 crc;
  return crc(static_cast<const unsigned char*>(data), n);
}

std::string shown(const std::string& name) {
  std::string s;
  for (std::size_t i = 0; i < name.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      s += hex;
    }
  }
  return name.size() > 200 ? s + "..." : s;
}

// The layout accepted is the one LibTorch's writer (miniz) produces, every byte accounted for:
// the entries back to back from offset 0 (local header, data, data descriptor), then the
// directory, the zip64 records if any, and the end record as the last 22 bytes. Every value
// LibTorch's reader uses is read as it reads it, and must agree with every other copy of it.
std::string zip_damage(const void* data, std::size_t size, std::vector<ZipEntry>* entries) {
  const Reader r{static_cast<const unsigned char*>(data), size};
  if (size < 22) return "shorter than any zip archive";
  // No archive comment (LibTorch writes none), so the end record is the last one, as miniz finds.
  const std::uint64_t eocd = size - 22;
  if (r.le(eocd, 4) != kEnd || r.le(eocd + 20, 2) != 0)
    return "no zip directory at its end (truncated?)";
  std::uint64_t disk = r.le(eocd + 4, 2), dir_disk = r.le(eocd + 6, 2), here = r.le(eocd + 8, 2),
                count = r.le(eocd + 10, 2), dir_size = r.le(eocd + 12, 4),
                dir_at = r.le(eocd + 16, 4), dir_end = eocd;
  // miniz takes the zip64 records whenever a locator lies before the end record, whatever the
  // end record says: so they must be whole, and the end record must say the same or all ones.
  if (eocd >= 20 + 56 && r.le(eocd - 20, 4) == kLocator) {
    const std::uint64_t loc = eocd - 20, z = loc - 56;
    if (r.le(loc + 4, 4) != 0 || r.le(loc + 16, 4) != 1) return "a multi-disk zip archive";
    if (r.le(loc + 8, 8) != z || r.le(z, 4) != kZip64End || r.le(z + 4, 8) != 44)
      return "a broken zip64 directory record";
    const std::uint64_t z_disk = r.le(z + 16, 4), z_dir_disk = r.le(z + 20, 4),
                        z_here = r.le(z + 24, 8), z_count = r.le(z + 32, 8),
                        z_size = r.le(z + 40, 8), z_at = r.le(z + 48, 8);
    auto same = [](std::uint64_t small, std::uint64_t wide, std::uint64_t ones) {
      return small == ones || small == wide;
    };
    if (!same(disk, z_disk, kOnes16) || !same(dir_disk, z_dir_disk, kOnes16) ||
        !same(here, z_here, kOnes16) || !same(count, z_count, kOnes16) ||
        !same(dir_size, z_size, kOnes32) || !same(dir_at, z_at, kOnes32))
      return "its zip64 and zip end records disagree";
    disk = z_disk, dir_disk = z_dir_disk, here = z_here, count = z_count;
    dir_size = z_size, dir_at = z_at, dir_end = z;
  } else if (here == kOnes16 || count == kOnes16 || dir_size == kOnes32 || dir_at == kOnes32) {
    return "a zip64 archive without locator";
  }
  if (disk != 0 || dir_disk != 0 || here != count) return "a multi-disk zip archive";
  if (count == 0) return "a zip archive without entries";
  if (dir_at > dir_end || dir_size != dir_end - dir_at)
    return "its zip directory is not where its end record says (truncated?)";

  std::set<std::string> names;  // lower case: miniz finds a name regardless of case
  std::uint64_t at = dir_at, next = 0;
  for (std::uint64_t e = 0; e < count; ++e) {
    if (dir_end - at < 46 || r.le(at, 4) != kCentral) return "a broken zip directory entry";
    const std::uint64_t flags = r.le(at + 8, 2), method = r.le(at + 10, 2), crc = r.le(at + 16, 4),
                        name_len = r.le(at + 28, 2), extra_len = r.le(at + 30, 2),
                        comment_len = r.le(at + 32, 2), attributes = r.le(at + 38, 4);
    std::uint64_t csize = r.le(at + 20, 4), usize = r.le(at + 24, 4), local = r.le(at + 42, 4);
    if (dir_end - at - 46 < name_len + extra_len + comment_len)
      return "a broken zip directory entry";
    const std::string name(reinterpret_cast<const char*>(r.d + at + 46), name_len);
    const std::string what = "entry '" + shown(name) + "'";
    // miniz reads a directory (a name ending in '/', the DOS directory bit) as empty.
    if (name.empty() || name.find('\0') != std::string::npos || name.back() == '/' ||
        (attributes & 0x10) != 0)
      return what + ": not a file name LibTorch writes";
    if (!names.insert(lower(name)).second) return what + " is there twice";
    if ((flags & ~(kHasDescriptor | kUtf8)) != 0) return what + ": flags LibTorch never sets";
    if (method != 0 && method != 8) return what + " is compressed by a method LibTorch never uses";
    if (comment_len != 0 || r.le(at + 34, 2) != 0) return what + ": a comment or another disk";
    Zip64Field z;
    if (!read_extras(r, at + 46 + name_len, extra_len, false, z) ||
        !widen(r, z, {&usize, &csize, &local}))
      return what + ": a broken zip64 field in the directory";
    // miniz reads nothing of an entry without compressed bytes.
    if (method == 0 ? csize != usize : csize == 0) return what + ": sizes disagree";
    // Back to back: nothing hidden between entries, nothing read twice.
    if (local != next) return what + " does not start where the entry before it ends";
    if (dir_at - local < 30 || r.le(local, 4) != kLocal)
      return what + ": its data lies outside the file (truncated?)";
    const std::uint64_t l_name = r.le(local + 26, 2), l_extra = r.le(local + 28, 2);
    std::uint64_t l_crc = r.le(local + 14, 4), l_csize = r.le(local + 18, 4),
                  l_usize = r.le(local + 22, 4);
    if (dir_at - local - 30 < l_name + l_extra) return what + " is cut short (truncated?)";
    const std::uint64_t start = local + 30 + l_name + l_extra;
    if (dir_at - start < csize) return what + " is cut short (truncated?)";
    Zip64Field lz;
    if (r.le(local + 6, 2) != flags || r.le(local + 8, 2) != method || l_name != name_len ||
        std::memcmp(r.d + local + 30, name.data(), name_len) != 0 ||
        !read_extras(r, local + 30 + l_name, l_extra, true, lz))
      return what + ": its local header disagrees with the directory";
    std::uint64_t after = start + csize;
    if (flags & kHasDescriptor) {
      // CRC and sizes follow the data (LibTorch writes zeros before it), 64-bit for the entries
      // that need zip64 fields.
      const int wide = z.found ? 8 : 4;
      const std::uint64_t len = 8 + 2 * wide;
      if (l_crc != 0 || l_csize != 0 || l_usize != 0)
        return what + ": its local header disagrees with the directory";
      if (dir_at - after < len || r.le(after, 4) != kDescriptor || r.le(after + 4, 4) != crc ||
          r.le(after + 8, wide) != csize || r.le(after + 8 + wide, wide) != usize)
        return what + ": its data descriptor disagrees with the directory";
      after += len;
    } else {
      // Both sizes in the local zip64 field if either is all ones, as the spec requires.
      if ((l_csize == kOnes32) != (l_usize == kOnes32) || !widen(r, lz, {&l_usize, &l_csize}) ||
          l_crc != crc || l_csize != csize || l_usize != usize)
        return what + ": its local header disagrees with the directory";
    }
    if (method == 0 && crc32(r.d + start, csize) != crc)
      return what + " does not match its checksum (the file is corrupt)";
    if (entries) entries->push_back({name, start, usize, method == 8, csize, std::uint32_t(crc)});
    next = after;
    at += 46 + name_len + extra_len + comment_len;
  }
  if (at != dir_end) return "its zip directory holds more than its entries";
  if (next != dir_at) return "bytes between its last entry and its zip directory";
  return {};
}

}  // namespace ampactor::internal
