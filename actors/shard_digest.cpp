// The digest a sharded run's manifest records of each shard file (and of a replica's bytes in
// memory, before they are written).
#include <ampactor/actors/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include "internal/sharded_run.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

namespace ampactor {

namespace {

/// file_digest's state: FNV-1a over 64-bit words (the tail zero-padded), then the length.
struct WordDigest {
  std::uint64_t h = 14695981039346656037ULL, n = 0;
  static constexpr std::uint64_t prime = 1099511628211ULL;
  /// `got` bytes at `p`, a whole number of words but for the last call; p has room to pad.
  void add(char* p, std::size_t got) {
    std::memset(p + got, 0, (8 - got % 8) % 8);
    for (std::size_t i = 0; i < got; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * prime;
    }
    n += got;
  }
  std::string text() const {
    const std::uint64_t f = (h ^ n) * prime;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f));
    return std::string("fnv1a64w:") + hex;
  }
};

}  // namespace

std::string file_digest(const std::string& path, std::uint64_t* bytes) {
  const auto refuse = [](const std::string& why) { return ScalerError(errc::bad_checkpoint, why); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw refuse("cannot open '" + path + "': " + std::strerror(errno));
  WordDigest d;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    d.add(buf.data(), std::size_t(in.gcount()));
  }
  if (in.bad()) throw refuse("cannot read '" + path + "'");
  if (bytes) *bytes = d.n;
  return d.text();
}

std::string internal::bytes_digest(const char* data, std::size_t n) {
  WordDigest d;
  const std::size_t whole = n / 8 * 8;
  std::uint64_t w;
  for (std::size_t i = 0; i < whole; i += 8) {
    std::memcpy(&w, data + i, 8);
    d.h = (d.h ^ w) * WordDigest::prime;
  }
  char tail[8];
  std::memcpy(tail, data + whole, n - whole);
  d.add(tail, n - whole);
  d.n = n;
  return d.text();
}

}  // namespace ampactor
