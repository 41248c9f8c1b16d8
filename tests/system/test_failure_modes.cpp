// Failure modes that need a process of their own: misuse that must end cleanly or fail fast with
// a clear message, never hang.
#include <signal.h>

#include <ampactor/trace/trace.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>

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
  Child c({AMPACTOR_TEST_CHILD, "foreign-thread"}, dir / "out");
  CHECK(c.wait(std::chrono::seconds(60)) == 0);
  CHECK(output(dir).find("returned") != std::string::npos);
}

TEST_CASE(
    "a GradScaler destroyed inside its own step job stops the program with a clear "
    "message instead of waiting for itself") {
  TempDir dir;
  Child c({AMPACTOR_TEST_CHILD, "inside-job"}, dir / "out");
  CHECK(c.wait(std::chrono::seconds(60)) == 128 + SIGABRT);
  CHECK(output(dir).find("destroyed inside one of its own step jobs") != std::string::npos);
}

TEST_CASE(
    "a recording killed with SIGKILL at random moments leaves a trace that says it is "
    "incomplete and replays identically as far as it goes") {
  std::mt19937 rng(11);
  for (int round = 0; round < 6; ++round) {
    CAPTURE(round);
    TempDir dir;
    const std::string trace = dir / "run.jsonl";
    {
      Child recorder({AMPACTOR_TEST_CHILD, "record", trace}, dir / "out");
      // Once it says it records, the header is on disk; once the trace has a second line, an
      // event is too (on a loaded machine that can take longer than the random wait below).
      // Then kill it at a random moment.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      auto lines = [&] {
        const std::vector<char> t = ampactor::test::read_bytes(trace);
        return std::count(t.begin(), t.end(), '\n');
      };
      while ((output(dir).find("recording") == std::string::npos || lines() < 2) &&
             std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      REQUIRE(output(dir).find("recording") != std::string::npos);
      REQUIRE(lines() >= 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
      REQUIRE(recorder.kill());
    }
    // Read with --prefix: a kill may land in the middle of a line.
    Child replay({AMPACTOR_REPLAY_EXE, trace, "--prefix"}, dir / "replay");
    const int rc = replay.wait(std::chrono::seconds(60));
    const std::vector<char> b = ampactor::test::read_bytes(dir / "replay");
    const std::string said(b.begin(), b.end());
    CAPTURE(said);
    CHECK(rc == 3);  // never 0: a cut trace is never "identical" without more
    CHECK(said.find("identical as far as it goes") != std::string::npos);
    CHECK(said.find("INCOMPLETE") != std::string::npos);
    // Every iteration the keeper finished was flushed: the header and the events seen above.
    const ampactor::Trace t = ampactor::read_trace(trace, /*prefix=*/true);
    CHECK_FALSE(t.complete);
    CHECK_FALSE(t.events.empty());
  }
}
