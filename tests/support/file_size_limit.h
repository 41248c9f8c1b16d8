// A process-wide file size limit for a test's scope: writes past it fail as on a full disk.
#pragma once

#include <sys/resource.h>

#include <csignal>

namespace ampactor::test {

/// Writes past `bytes` fail with EFBIG (as on a full disk, ENOSPC) while it lives: the process's
/// file size limit, with SIGXFSZ ignored so that the write returns the error.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
  rlimit old{};
  void (*old_handler)(int) = nullptr;
};

}  // namespace ampactor::test
