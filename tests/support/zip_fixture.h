// LibTorch archives taken apart and put together again, for the tests of load_checkpoint's
// checks: their records, an archive of changed records, a zip laid out by hand, and the offsets
// of a small archive's entries.
#pragma once

#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zip_check.h"

namespace ampactor::test {

using Records = std::vector<std::pair<std::string, std::string>>;

/// The records of a LibTorch archive in its order, named under its folder ("data.pkl").
inline Records records_of(const std::string& bytes) {
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  Records out;
  for (const std::string& name : reader.getAllRecords()) {  // LibTorch 1.13: without the folder
    auto [data, n] = reader.getRecord(name);
    out.emplace_back(name, std::string(static_cast<const char*>(data.get()), n));
  }
  return out;
}

inline std::string record_of(const std::string& bytes, const std::string& name) {
  for (const auto& [n, data] : records_of(bytes))
    if (n == name) return data;
  throw std::runtime_error("no record " + name);
}

/// The archive LibTorch's writer makes of `records` (it writes "version" itself, and LibTorch
/// 2.x a serialization id).
inline std::string archive_with(const Records& records) {
  std::string out;
  {
    caffe2::serialize::PyTorchStreamWriter w([&](const void* p, std::size_t n) {
      out.append(static_cast<const char*>(p), n);
      return n;
    });
    for (const auto& [name, data] : records)
      if (name != "version" && name != ".data/serialization_id")
        w.writeRecord(name, data.data(), data.size());
  }
  return out;
}

/// `bytes` with record `name` holding `data` (added if it has none).
inline std::string with_record(const std::string& bytes, const std::string& name,
                               const std::string& data) {
  Records records = records_of(bytes);
  bool found = false;
  for (auto& [n, d] : records)
    if (n == name) d = data, found = true;
  if (!found) records.emplace_back(name, data);
  return archive_with(records);
}

inline std::string without_record(const std::string& bytes, const std::string& name) {
  Records records;
  for (auto& r : records_of(bytes))
    if (r.first != name) records.push_back(r);
  return archive_with(records);
}

/// `s` with the first `from` replaced by `to`.
inline std::string patched(std::string s, const std::string& from, const std::string& to) {
  const std::size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("nothing to patch");
  return s.replace(at, from.size(), to);
}

namespace detail {
inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
}  // namespace detail

/// A zip of `records` under "archive/", stored, laid out by hand as the zip spec allows: CRC and
/// sizes after each entry's data in a data descriptor (as LibTorch writes them), or in its local
/// header. No zip64 records and no alignment, which LibTorch's writer adds.
inline std::string plain_zip(const Records& records, bool descriptors) {
  using detail::put_le;
  std::string z, dir;
  for (const auto& [name, data] : records) {
    const std::string full = "archive/" + name;
    const std::uint32_t crc = internal::crc32(data.data(), data.size());
    const std::uint64_t local = z.size(), flags = descriptors ? 8 : 0;
    put_le(z, 0x04034b50, 4), put_le(z, 20, 2), put_le(z, flags, 2), put_le(z, 0, 2);
    put_le(z, 0, 4), put_le(z, descriptors ? 0 : crc, 4);
    put_le(z, descriptors ? 0 : data.size(), 4), put_le(z, descriptors ? 0 : data.size(), 4);
    put_le(z, full.size(), 2), put_le(z, 0, 2);
    z += full + data;
    if (descriptors)
      put_le(z, 0x08074b50, 4), put_le(z, crc, 4), put_le(z, data.size(), 4),
          put_le(z, data.size(), 4);
    put_le(dir, 0x02014b50, 4), put_le(dir, 20, 2), put_le(dir, 20, 2), put_le(dir, flags, 2);
    put_le(dir, 0, 2), put_le(dir, 0, 4), put_le(dir, crc, 4), put_le(dir, data.size(), 4);
    put_le(dir, data.size(), 4), put_le(dir, full.size(), 2), put_le(dir, 0, 2);
    put_le(dir, 0, 2), put_le(dir, 0, 2), put_le(dir, 0, 2), put_le(dir, 0, 4);
    put_le(dir, local, 4);
    dir += full;
  }
  const std::uint64_t dir_at = z.size();
  z += dir;
  put_le(z, 0x06054b50, 4), put_le(z, 0, 2), put_le(z, 0, 2), put_le(z, records.size(), 2);
  put_le(z, records.size(), 2), put_le(z, dir.size(), 4), put_le(z, dir_at, 4), put_le(z, 0, 2);
  return z;
}

/// Where things are in an archive under 4 GiB, for changing them in place.
struct ZipView {
  std::string& z;
  std::uint64_t eocd = 0;
  std::vector<std::uint64_t> central;  // the directory's entries

  explicit ZipView(std::string& bytes) : z(bytes), eocd(bytes.size() - 22) {
    std::uint64_t at = le(eocd + 16, 4);
    for (std::uint64_t i = 0; i < le(eocd + 10, 2); ++i) {
      central.push_back(at);
      at += 46 + le(at + 28, 2) + le(at + 30, 2) + le(at + 32, 2);
    }
  }
  std::uint64_t le(std::uint64_t at, int bytes) const {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = v << 8 | static_cast<unsigned char>(z.at(at + i));
    return v;
  }
  void put(std::uint64_t at, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      z.at(at + i) = static_cast<char>((v >> (8 * i)) & 0xFF);
  }
  std::string name(std::size_t i) const {
    return z.substr(central[i] + 46, le(central[i] + 28, 2));
  }
  /// The entry whose name ends with `suffix`.
  std::size_t entry(const std::string& suffix) const {
    for (std::size_t i = 0; i < central.size(); ++i) {
      const std::string n = name(i);
      if (n.size() >= suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        return i;
    }
    throw std::runtime_error("no entry " + suffix);
  }
  std::uint64_t flags(std::size_t i) const { return le(central[i] + 8, 2); }
  std::uint64_t local(std::size_t i) const { return le(central[i] + 42, 4); }
  std::uint64_t size(std::size_t i) const { return le(central[i] + 20, 4); }
  std::uint64_t data(std::size_t i) const {
    return local(i) + 30 + le(local(i) + 26, 2) + le(local(i) + 28, 2);
  }
  std::uint64_t descriptor(std::size_t i) const { return data(i) + size(i); }
  /// Makes entry i's CRC (directory and data descriptor) that of its bytes as they now are.
  void fix_crc(std::size_t i) {
    const std::uint32_t crc = internal::crc32(z.data() + data(i), size(i));
    put(central[i] + 16, crc, 4);
    put(descriptor(i) + 4, crc, 4);
  }
};

}  // namespace ampactor::test
