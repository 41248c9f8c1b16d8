// A case that cannot run here (no GPU, a missing file) says so with AMPACTOR_SKIP and returns:
// the listener in test_main.cpp counts it, and a run whose every case skipped exits with
// kSkipExitCode, which ctest (SKIP_RETURN_CODE) reports as skipped instead of passed.
#pragma once

#include <doctest/doctest.h>

#include <string>

namespace ampactor::test {

inline constexpr int kSkipExitCode = 77;

/// Set by AMPACTOR_SKIP, read and cleared by the listener at the end of each case.
inline bool& case_skipped() {
  static bool skipped = false;
  return skipped;
}

}  // namespace ampactor::test

/// Marks the running case skipped with a reason and leaves it (use in the case's own body).
#define AMPACTOR_SKIP(why)                    \
  do {                                        \
    MESSAGE("skipped: " << std::string(why)); \
    ::ampactor::test::case_skipped() = true;  \
    return;                                   \
  } while (0)
