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

namespace {

/// The directory's place and size, as the end records give them.
struct EndRecord {
  std::uint64_t disk, dir_disk, here, count, dir_size, dir_at, dir_end;
};

/// miniz takes the zip64 records whenever a locator lies before the end record, whatever the end
/// record says: so they must be whole, and the end record must say the same or all ones.
std::string read_zip64_end(const Reader& r, std::uint64_t eocd, EndRecord& e) {
  const std::uint64_t loc = eocd - 20, z = loc - 56;
  if (r.le(loc + 4, 4) != 0 || r.le(loc + 16, 4) != 1) return "a multi-disk zip archive";
  if (r.le(loc + 8, 8) != z || r.le(z, 4) != kZip64End || r.le(z + 4, 8) != 44)
    return "a broken zip64 directory record";
  const std::uint64_t z_disk = r.le(z + 16, 4), z_dir_disk = r.le(z + 20, 4),
                      z_here = r.le(z + 24, 8), z_count = r.le(z + 32, 8), z_size = r.le(z + 40, 8),
                      z_at = r.le(z + 48, 8);
  auto same = [](std::uint64_t small, std::uint64_t wide, std::uint64_t ones) {
    return small == ones || small == wide;
  };
  if (!same(e.disk, z_disk, kOnes16) || !same(e.dir_disk, z_dir_disk, kOnes16) ||
      !same(e.here, z_here, kOnes16) || !same(e.count, z_count, kOnes16) ||
      !same(e.dir_size, z_size, kOnes32) || !same(e.dir_at, z_at, kOnes32))
    return "its zip64 and zip end records disagree";
  e = {z_disk, z_dir_disk, z_here, z_count, z_size, z_at, z};
  return {};
}

/// The end record (and zip64 records) of an archive of `size` >= 22 bytes, checked.
std::string read_end(const Reader& r, std::size_t size, EndRecord& e) {
  // No archive comment (LibTorch writes none), so the end record is the last one, as miniz finds.
  const std::uint64_t eocd = size - 22;
  if (r.le(eocd, 4) != kEnd || r.le(eocd + 20, 2) != 0)
    return "no zip directory at its end (truncated?)";
  e.disk = r.le(eocd + 4, 2), e.dir_disk = r.le(eocd + 6, 2), e.here = r.le(eocd + 8, 2);
  e.count = r.le(eocd + 10, 2), e.dir_size = r.le(eocd + 12, 4), e.dir_at = r.le(eocd + 16, 4);
  e.dir_end = eocd;
  if (eocd >= 20 + 56 && r.le(eocd - 20, 4) == kLocator) {
    if (std::string why = read_zip64_end(r, eocd, e); !why.empty()) return why;
  } else if (e.here == kOnes16 || e.count == kOnes16 || e.dir_size == kOnes32 ||
             e.dir_at == kOnes32) {
    return "a zip64 archive without locator";
  }
  if (e.disk != 0 || e.dir_disk != 0 || e.here != e.count) return "a multi-disk zip archive";
  if (e.count == 0) return "a zip archive without entries";
  if (e.dir_at > e.dir_end || e.dir_size != e.dir_end - e.dir_at)
    return "its zip directory is not where its end record says (truncated?)";
  return {};
}

/// One entry as the directory describes it; sizes and offset widened from its zip64 field.
struct DirEntry {
  std::uint64_t flags, method, crc, name_len, extra_len, comment_len, csize, usize, local;
  std::string name, what;  // what: the name as shown in a refusal
  Zip64Field z;
};

/// The directory entry at `at`, checked on its own and against the names before it (`names`).
std::string read_dir_entry(const Reader& r, std::uint64_t at, std::uint64_t dir_end,
                           std::set<std::string>& names, DirEntry& d) {
  if (dir_end - at < 46 || r.le(at, 4) != kCentral) return "a broken zip directory entry";
  const std::uint64_t attributes = r.le(at + 38, 4);
  d.flags = r.le(at + 8, 2), d.method = r.le(at + 10, 2), d.crc = r.le(at + 16, 4);
  d.name_len = r.le(at + 28, 2), d.extra_len = r.le(at + 30, 2), d.comment_len = r.le(at + 32, 2);
  d.csize = r.le(at + 20, 4), d.usize = r.le(at + 24, 4), d.local = r.le(at + 42, 4);
  if (dir_end - at - 46 < d.name_len + d.extra_len + d.comment_len)
    return "a broken zip directory entry";
  d.name.assign(reinterpret_cast<const char*>(r.d + at + 46), d.name_len);
  d.what = "entry '" + shown(d.name) + "'";
  const std::string& name = d.name;
  const std::string& what = d.what;
  // miniz reads a directory (a name ending in '/', the DOS directory bit) as empty.
  if (name.empty() || name.find('\0') != std::string::npos || name.back() == '/' ||
      (attributes & 0x10) != 0)
    return what + ": not a file name LibTorch writes";
  if (!names.insert(lower(name)).second) return what + " is there twice";
  if ((d.flags & ~(kHasDescriptor | kUtf8)) != 0) return what + ": flags LibTorch never sets";
  if (d.method != 0 && d.method != 8)
    return what + " is compressed by a method LibTorch never uses";
  if (d.comment_len != 0 || r.le(at + 34, 2) != 0) return what + ": a comment or another disk";
  if (!read_extras(r, at + 46 + d.name_len, d.extra_len, false, d.z) ||
      !widen(r, d.z, {&d.usize, &d.csize, &d.local}))
    return what + ": a broken zip64 field in the directory";
  // miniz reads nothing of an entry without compressed bytes.
  if (d.method == 0 ? d.csize != d.usize : d.csize == 0) return what + ": sizes disagree";
  return {};
}

/// The entry's local header, which must start at `next` and agree with its directory entry `d`,
/// and its data descriptor if any. `start`: where its data begins; `after`: where it ends.
std::string check_local(const Reader& r, const DirEntry& d, std::uint64_t next,
                        std::uint64_t dir_at, std::uint64_t& start, std::uint64_t& after) {
  const std::uint64_t local = d.local;
  const std::string& what = d.what;
  // Back to back: nothing hidden between entries, nothing read twice.
  if (local != next) return what + " does not start where the entry before it ends";
  if (dir_at - local < 30 || r.le(local, 4) != kLocal)
    return what + ": its data lies outside the file (truncated?)";
  const std::uint64_t l_name = r.le(local + 26, 2), l_extra = r.le(local + 28, 2);
  std::uint64_t l_crc = r.le(local + 14, 4), l_csize = r.le(local + 18, 4),
                l_usize = r.le(local + 22, 4);
  if (dir_at - local - 30 < l_name + l_extra) return what + " is cut short (truncated?)";
  start = local + 30 + l_name + l_extra;
  if (dir_at - start < d.csize) return what + " is cut short (truncated?)";
  Zip64Field lz;
  if (r.le(local + 6, 2) != d.flags || r.le(local + 8, 2) != d.method || l_name != d.name_len ||
      std::memcmp(r.d + local + 30, d.name.data(), d.name_len) != 0 ||
      !read_extras(r, local + 30 + l_name, l_extra, true, lz))
    return what + ": its local header disagrees with the directory";
  after = start + d.csize;
  if (d.flags & kHasDescriptor) {
    // CRC and sizes follow the data (LibTorch writes zeros before it), 64-bit for the entries
    // that need zip64 fields.
    const int wide = d.z.found ? 8 : 4;
    const std::uint64_t len = 8 + 2 * wide;
    if (l_crc != 0 || l_csize != 0 || l_usize != 0)
      return what + ": its local header disagrees with the directory";
    if (dir_at - after < len || r.le(after, 4) != kDescriptor || r.le(after + 4, 4) != d.crc ||
        r.le(after + 8, wide) != d.csize || r.le(after + 8 + wide, wide) != d.usize)
      return what + ": its data descriptor disagrees with the directory";
    after += len;
  } else {
    // Both sizes in the local zip64 field if either is all ones, as the spec requires.
    if ((l_csize == kOnes32) != (l_usize == kOnes32) || !widen(r, lz, {&l_usize, &l_csize}) ||
        l_crc != d.crc || l_csize != d.csize || l_usize != d.usize)
      return what + ": its local header disagrees with the directory";
  }
  return {};
}

}  // namespace

// The layout accepted is the one LibTorch's writer (miniz) produces, every byte accounted for:
// the entries back to back from offset 0 (local header, data, data descriptor), then the
// directory, the zip64 records if any, and the end record as the last 22 bytes. Every value
// LibTorch's reader uses is read as it reads it, and must agree with every other copy of it.
std::string zip_damage(const void* data, std::size_t size, std::vector<ZipEntry>* entries) {
  const Reader r{static_cast<const unsigned char*>(data), size};
  if (size < 22) return "shorter than any zip archive";
  EndRecord end{};
  if (std::string why = read_end(r, size, end); !why.empty()) return why;
  std::set<std::string> names;  // lower case: miniz finds a name regardless of case
  std::uint64_t at = end.dir_at, next = 0;
  for (std::uint64_t e = 0; e < end.count; ++e) {
    DirEntry d{};
    if (std::string why = read_dir_entry(r, at, end.dir_end, names, d); !why.empty()) return why;
    std::uint64_t start = 0, after = 0;
    if (std::string why = check_local(r, d, next, end.dir_at, start, after); !why.empty())
      return why;
    if (d.method == 0 && crc32(r.d + start, d.csize) != d.crc)
      return d.what + " does not match its checksum (the file is corrupt)";
    if (entries)
      entries->push_back({d.name, start, d.usize, d.method == 8, d.csize, std::uint32_t(d.crc)});
    next = after;
    at += 46 + d.name_len + d.extra_len + d.comment_len;
  }
  if (at != end.dir_end) return "its zip directory holds more than its entries";
  if (next != end.dir_at) return "bytes between its last entry and its zip directory";
  return {};
}

}  // namespace ampactor::internal
