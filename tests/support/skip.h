// A case that cannot run here (no GPU, a missing file) says so with AMPACTOR_SKIP and returns:
// the listener in test_main.cpp counts it, and a run whose every case skipped exits with
// kSkipExitCode, which ctest (SKIP_RETURN_CODE) reports as skipped instead of passed.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
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

/// A case that needs a GPU and finds none: skipped, except where AMPACTOR_REQUIRE_GPU is set
/// (scripts/gpu-check.sh sets it), so that on a GPU host a GPU case that cannot run fails instead
/// of passing as skipped.
#define AMPACTOR_SKIP_NO_GPU(why)                                                         \
  do {                                                                                    \
    if (std::getenv("AMPACTOR_REQUIRE_GPU"))                                              \
      FAIL("AMPACTOR_REQUIRE_GPU is set but this case cannot run: " << std::string(why)); \
    AMPACTOR_SKIP(why);                                                                   \
  } while (0)
