// Removing a folder and what it holds, for the tests' scratch folders. Not by
// std::filesystem::remove_all or its iterators: a PyTorch wheel's libtorch_cpu.so exports copies of
// them (from its toolchain's static libstdc++ parts) that crash when called from code built with
// another GCC (seen with torch 2.11), and the dynamic linker binds a test's calls to those copies.
#pragma once

#include <dirent.h>
#include <ftw.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace ampactor::test {

/// Removes `dir` and everything under it; a missing `dir` is no error.
inline void remove_tree(const std::string& dir) {
  ::nftw(
      dir.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

/// The names in a folder, sorted, without . and .. (empty if it cannot be read).
inline std::vector<std::string> list_folder(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ampactor::test
