// What a bench ran with, recorded in its JSON as "setup": the BLAS library the process loaded and
// the thread counts. Both move every figure (Debian's reference BLAS is about 15x slower than
// OpenBLAS at a matmul), so a figure without them cannot be compared with another.
#pragma once

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace ampactor::bench {

/// The BLAS libraries mapped into this process (LibTorch loads its BLAS at start), by their real
/// path: Debian's libblas.so.3 resolves through its alternatives to the reference BLAS
/// (blas/libblas.so.3) or OpenBLAS (openblas-openmp/libblas.so.3).
inline std::string blas_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> found;
  for (std::string line; std::getline(maps, line);) {
    const std::size_t at = line.find('/');
    if (at == std::string::npos) continue;
    const std::string path = line.substr(at);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.find("blas") != std::string::npos || name.find("mkl") != std::string::npos)
      found.insert(path);
  }
  std::string out;
  for (const std::string& p : found)
    out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "none found" : out;
}

inline nlohmann::json env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v ? nlohmann::json(v) : nlohmann::json(nullptr);
}

/// The "setup" entry: the BLAS, this thread's LibTorch intra-op and the inter-op thread counts
/// when it is called (the benches call it as they write), the hardware threads, and the
/// environment variables that set the teams.
inline nlohmann::json run_setup() {
  return {{"blas", blas_libraries()},
          {"threads",
           {{"intra_op", at::get_num_threads()},
            {"inter_op", at::get_num_interop_threads()},
            {"hardware", std::thread::hardware_concurrency()},
            {"OMP_NUM_THREADS", env_or_null("OMP_NUM_THREADS")},
            {"OPENBLAS_NUM_THREADS", env_or_null("OPENBLAS_NUM_THREADS")}}}};
}

}  // namespace ampactor::bench
