// Failure modes that need a process of their own: misuse that must end cleanly or fail fast with
// a clear message, never hang.
#include <signal.h>

#include <chrono>
#include <string>

#include "checkpoint_fixture.h"
#include "child_process.h"

using ampactor::test::Child;
using ampactor::test::TempDir;

namespace {
std::string output(const TempDir& dir) {
  const std::vector<char> b = ampactor::test::read_bytes(dir / "out");
  return {b.begin(), b.end()};
}
}  // namespace

TEST_CASE("a GradScaler destroyed on another thread than the one that made it shuts down") {
  // CAF 0.17 keeps a per-thread reference to its logger; the scaler lets go of its own, so its
  // actor system no longer waits for the thread that made it.
  TempDir dir;
  Child c({AMPACTOR_MISUSE_CHILD, "foreign-thread"}, dir / "out");
  CHECK(c.wait(std::chrono::seconds(60)) == 0);
  CHECK(output(dir).find("returned") != std::string::npos);
}

TEST_CASE(
    "a GradScaler destroyed inside its own step job stops the program with a clear "
    "message instead of waiting for itself") {
  TempDir dir;
  Child c({AMPACTOR_MISUSE_CHILD, "inside-job"}, dir / "out");
  CHECK(c.wait(std::chrono::seconds(60)) == 128 + SIGABRT);
  CHECK(output(dir).find("destroyed inside one of its own step jobs") != std::string::npos);
}
