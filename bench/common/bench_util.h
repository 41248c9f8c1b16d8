// Small helpers the benchmarks share.
#pragma once

#include <ftw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace ampactor::bench {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Removes a folder and what it holds. Not by std::filesystem::remove_all: a PyTorch wheel's
/// libtorch.so exports a copy of it that jumps to null (seen with torch 2.11), and the dynamic
/// linker binds the call to that copy.
inline void remove_tree(const std::string& dir) {
  nftw(
      dir.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace ampactor::bench
