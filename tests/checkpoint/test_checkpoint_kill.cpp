// Processes killed with SIGKILL: the checkpoint at the path is always the old one or the new one,
// whole; and examples/checkpoint_resume, killed at random points and resumed from its last
// complete checkpoint, ends exactly where a run never killed ends.
#include "doctest_torch.h"

#include <ampactor/checkpoint/checkpoint.h>

#include <torch/serialize.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include <chrono>
#include <random>
#include <thread>

#include "checkpoint_fixture.h"
#include "child_process.h"

namespace {

using ampactor::test::Child;
using Clock = std::chrono::steady_clock;
using ampactor::test::TempDir;

std::string text_of(const std::string& path) {
  const std::vector<char> b = ampactor::test::read_bytes(path);
  return {b.begin(), b.end()};
}

/// The checkpoint temporaries in `dir` (ckpt.pt.tmp.HOST.PID.XXXXXX).
int temporaries(const TempDir& dir) {
  int n = 0;
  for (const std::string& name : ampactor::test::list_dir(dir))
    n += name.rfind("ckpt.pt.tmp.", 0) == 0;
  return n;
}

std::string final_line(const std::string& out) {
  const auto at = out.find("final:");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST_CASE(
    "save_atomically: a writer killed at any moment leaves the old checkpoint or the new "
    "one, whole") {
  TempDir dir;
  const std::string path = dir / "ckpt.pt";
  std::mt19937 rng(7);
  int checked = 0, mid_write = 0, round = 0;
  // At least 8 kills, and on until one has landed inside a write (a slow build spends longer
  // outside them), at most 40.
  for (; round < 8 || (mid_write == 0 && round < 40); ++round) {
    struct stat st;
    const ino_t before = ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
    Child writer({AMPACTOR_CHECKPOINT_WRITER, path}, dir / "writer.log");
    // Once this writer has renamed its first checkpoint into place (a new inode), it spends its
    // time writing the next ones.
    const auto limit = Clock::now() + std::chrono::seconds(60);
    while ((::stat(path.c_str(), &st) != 0 || st.st_ino == before) && Clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    REQUIRE_MESSAGE(writer.kill(), text_of(dir / "writer.log"));
    mid_write += temporaries(dir) > 0;
    torch::serialize::InputArchive a;
    ampactor::load_checkpoint(a, path);  // never a half-written file
    c10::IValue version;
    torch::Tensor data;
    a.read("version", version);
    a.read("data", data);
    CHECK(version.toInt() >= 1);
    CHECK(data.numel() == 2 << 20);
    CHECK(torch::all(data == double(version.toInt())).item<bool>());
    ++checked;
  }
  CHECK(checked == round);
  CHECK(mid_write >= 1);  // some kills did land inside a write
  // A killed writer leaves its temporary file, which the next writer's save removes: at most the
  // last one's is left.
  CHECK(temporaries(dir) <= 1);
  CHECK(ampactor::test::list_dir(dir).size() <= 3);  // ckpt.pt, its temporary, writer.log
}

TEST_CASE("save_atomically: two processes writing one path never fail and publish whole files") {
  TempDir dir;
  const std::string path = dir / "ckpt.pt";
  Child a({AMPACTOR_CHECKPOINT_WRITER, path}, dir / "a.log"),
      b({AMPACTOR_CHECKPOINT_WRITER, path}, dir / "b.log");
  // Every load while both write: a whole checkpoint of one of them (its CRCs checked). Counted,
  // not timed: a sanitizer build loads an 8 MiB file in about a second.
  int loads = 0;
  const auto least = Clock::now() + std::chrono::seconds(2), end = least + std::chrono::seconds(90);
  while ((loads < 12 || Clock::now() < least) && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;  // none published yet
    torch::serialize::InputArchive ar;
    ampactor::load_checkpoint(ar, path);
    c10::IValue version;
    torch::Tensor data;
    ar.read("version", version);
    ar.read("data", data);
    CHECK(torch::all(data == double(version.toInt())).item<bool>());
    ++loads;
  }
  CHECK(loads >= 12);
  // A failed save throws out of the writer's main: both still running means none failed.
  CHECK_MESSAGE(a.kill(), text_of(dir / "a.log"));
  CHECK_MESSAGE(b.kill(), text_of(dir / "b.log"));
  // The next save removes the temporaries the killed writers left.
  torch::serialize::OutputArchive last;
  last.write("version", c10::IValue(std::int64_t(0)));
  ampactor::save_atomically(last, path);
  CHECK(temporaries(dir) == 0);
}

TEST_CASE("checkpoint_resume killed with SIGKILL at random points resumes bit for bit") {
  struct Mode {
    std::vector<std::string> args;
  };
  const Mode modes[] = {
      {{"--optimizer", "sgd", "--staleness", "0"}},
      {{"--optimizer", "sgd", "--staleness", "1"}},
      {{"--optimizer", "sgd", "--staleness", "1", "--swap-defer"}},
      {{"--optimizer", "adam", "--staleness", "0"}},
      {{"--optimizer", "adam", "--staleness", "1"}},
      {{"--optimizer", "adam", "--staleness", "1", "--swap-defer"}},
  };
  std::mt19937 rng(2026);
  int resumes = 0, all_kills = 0;
  for (const Mode& mode : modes) {
    std::string name;
    for (const std::string& a : mode.args)
      name += a + " ";
    CAPTURE(name);
    TempDir dir;
    auto argv = [&](const std::string& ckpt) {
      std::vector<std::string> v = {
          AMPACTOR_CHECKPOINT_EXAMPLE, "--steps", "240", "--every", "10", "--dir", ckpt};
      v.insert(v.end(), mode.args.begin(), mode.args.end());
      return v;
    };
    // The time between two of a run's checkpoints.
    Child ref(argv(dir / "ref"), dir / "ref.log");
    const std::string ref_ckpt = dir / "ref/last.pt";
    struct stat st;
    while (::stat(ref_ckpt.c_str(), &st) != 0 && ref.running())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto t0 = Clock::now();
    REQUIRE(ref.wait(std::chrono::seconds(120)) == 0);
    const auto gap_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count() / 23;
    const std::string want = final_line(text_of(dir / "ref.log"));
    REQUIRE(!want.empty());
    // Three kills, each once the victim has put 1 to 6 checkpoints of its own in place (new
    // inodes; under a loaded CI the time a run takes to start says little about when it
    // writes), at a random time before its next one; then a run to the end.
    const std::string ckpt = dir / "run/last.pt";
    int kills = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      ino_t seen = ::stat(ckpt.c_str(), &st) == 0 ? st.st_ino : 0;
      Child victim(argv(dir / "run"), dir / "run.log");
      const auto limit = Clock::now() + std::chrono::seconds(120);
      // (One that resumes a finished run writes nothing and exits.)
      for (int n = 0, target = 1 + int(rng() % 6); n < target && victim.running();) {
        REQUIRE_MESSAGE(Clock::now() < limit, text_of(dir / "run.log"));
        if (::stat(ckpt.c_str(), &st) == 0 && st.st_ino != seen) seen = st.st_ino, ++n;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % (gap_ms + 1)));
      kills += victim.kill();
      resumes += text_of(dir / "run.log").find("resumed from") != std::string::npos;
    }
    Child last(argv(dir / "run"), dir / "run.log");
    REQUIRE(last.wait(std::chrono::seconds(120)) == 0);
    const std::string out = text_of(dir / "run.log");
    resumes += out.find("resumed from") != std::string::npos;
    MESSAGE(name << ": " << kills << " kill(s); last run: " << out.substr(0, out.find('\n')));
    CHECK(final_line(out) == want);
    all_kills += kills;
  }
  CHECK(all_kills >= int(std::size(modes)));  // most victims were killed mid-run
  // Every run after the first starts from a checkpoint: 3 per mode.
  CHECK(resumes == 3 * int(std::size(modes)));
}
