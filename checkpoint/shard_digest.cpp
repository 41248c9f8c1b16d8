// The digest a sharded run's manifest records of each shard file (and of a replica's bytes in
// memory, before they are written).
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include "internal/sharded_files.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
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
  // A regular file only, read to the size it had when opened: a FIFO or /dev/zero never ends.
  std::uint64_t size = 0;
  const int fd = open_regular_file(path, "the shard file", &size);
  WordDigest d;
  constexpr std::size_t chunk = 1 << 20;  // whole words: add() pads only the last piece
  std::vector<char> buf(chunk + 8);
  for (std::uint64_t left = size; left > 0;) {
    const std::size_t want = std::size_t(std::min<std::uint64_t>(left, chunk));
    std::size_t got = 0;
    while (got < want) {
      const ssize_t n = ::read(fd, buf.data() + got, want - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw ScalerError(errc::bad_checkpoint,
                          "cannot read '" + path + "': " + std::string(std::strerror(err)));
      }
      if (n == 0) break;  // shrunk meanwhile: its size and digest say so
      got += std::size_t(n);
    }
    d.add(buf.data(), got);
    left = got < want ? 0 : left - got;
  }
  ::close(fd);
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
