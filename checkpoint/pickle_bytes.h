// The byte cursor of ampactor's strict pickle readers (pickle_dict.cpp, pickle_screen.cpp): every
// read checked against the bytes left, every refusal naming its byte. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ampactor::internal {

/// Refusals throw Problem(prefix + why + " (byte N)").
template <typename Problem>
class PickleBytes {
 protected:
  PickleBytes(const char* data, std::size_t size, const char* prefix)
      : p_(data), size_(size), prefix_(prefix) {}

  [[noreturn]] void fail(std::size_t at, const std::string& why) const {
    throw Problem(prefix_ + why + " (byte " + std::to_string(at) + ")");
  }
  /// The next n bytes, which must be there.
  const char* bytes(std::uint64_t n) {
    if (n > size_ - pos_) fail(pos_, "the pickle ends inside an opcode");
    const char* out = p_ + pos_;
    pos_ += std::size_t(n);
    return out;
  }
  /// The next n bytes as a little-endian unsigned number (n <= 8).
  std::uint64_t unsigned_le(std::size_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes(n));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i)
      v |= std::uint64_t(b[i]) << (8 * i);
    return v;
  }

  const char* p_;
  std::size_t size_;
  std::size_t pos_ = 0;

 private:
  std::string prefix_;
};

}  // namespace ampactor::internal
