// Files for the checkpoint tests: a temporary folder, whole-file reads and writes, and a zip64
// archive built by hand (LibTorch writes zip64 records only beyond 4 GiB).
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "remove_tree.h"
#include "zip_check.h"

namespace ampactor::test {

/// A folder under /tmp, removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ampactor-ckpt-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { remove_tree(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size()));
}

/// The names in a folder, sorted, without . and ..
inline std::vector<std::string> list_dir(const TempDir& dir) {
  return list_folder(dir.path());
}

inline std::string zip_damage_of(const std::vector<char>& bytes) {
  return internal::zip_damage(bytes.data(), bytes.size());
}

namespace detail {
inline void put(std::vector<char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
}  // namespace detail

/// Where zip64_archive(name, ...) puts the entry's data.
inline std::size_t zip64_data_offset(const std::string& name) {
  return 30 + name.size() + 20;
}

/// One stored entry, every size and offset in zip64 records, as the zip spec lays them out.
inline std::vector<char> zip64_archive(const std::string& name, const std::string& data) {
  using detail::put;
  const std::uint32_t crc = internal::crc32(data.data(), data.size());
  std::vector<char> z;
  put(z, 0x04034b50, 4), put(z, 45, 2), put(z, 0, 2), put(z, 0, 2), put(z, 0, 4);
  put(z, crc, 4), put(z, 0xFFFFFFFF, 4), put(z, 0xFFFFFFFF, 4);
  put(z, name.size(), 2), put(z, 20, 2);
  z.insert(z.end(), name.begin(), name.end());
  put(z, 0x0001, 2), put(z, 16, 2), put(z, data.size(), 8), put(z, data.size(), 8);
  z.insert(z.end(), data.begin(), data.end());
  const std::size_t dir_at = z.size();
  put(z, 0x02014b50, 4), put(z, 45, 2), put(z, 45, 2), put(z, 0, 2), put(z, 0, 2), put(z, 0, 4);
  put(z, crc, 4), put(z, 0xFFFFFFFF, 4), put(z, 0xFFFFFFFF, 4);
  put(z, name.size(), 2), put(z, 28, 2), put(z, 0, 2), put(z, 0, 2), put(z, 0, 2), put(z, 0, 4);
  put(z, 0xFFFFFFFF, 4);
  z.insert(z.end(), name.begin(), name.end());
  put(z, 0x0001, 2), put(z, 24, 2), put(z, data.size(), 8), put(z, data.size(), 8), put(z, 0, 8);
  const std::size_t dir_size = z.size() - dir_at, z64_at = z.size();
  put(z, 0x06064b50, 4), put(z, 44, 8), put(z, 45, 2), put(z, 45, 2), put(z, 0, 4), put(z, 0, 4);
  put(z, 1, 8), put(z, 1, 8), put(z, dir_size, 8), put(z, dir_at, 8);
  put(z, 0x07064b50, 4), put(z, 0, 4), put(z, z64_at, 8), put(z, 1, 4);
  put(z, 0x06054b50, 4), put(z, 0xFFFF, 2), put(z, 0xFFFF, 2), put(z, 0xFFFF, 2);
  put(z, 0xFFFF, 2), put(z, 0xFFFFFFFF, 4), put(z, 0xFFFFFFFF, 4), put(z, 0, 2);
  return z;
}

}  // namespace ampactor::test
