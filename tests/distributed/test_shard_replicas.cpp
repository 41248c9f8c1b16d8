// A sharded save's replicas (shard_replicas buddy: the next rank, also on one host): written
// into a folder of the buddy's own, and never over an original in a folder the ranks share.
#include "dist_fixture.h"

#include <poll.h>
#include <sys/inotify.h>

#include <map>
#include <set>

using namespace ampactor::test::dist;

namespace {

std::set<std::string> files_in(const fs::path& dir) {
  const auto names = ampactor::test::list_folder(dir.string());
  return {names.begin(), names.end()};
}

/// 2 ranks started by hand, rank r saving to `ckpt[r]` at iteration 5 with buddy replicas; both
/// must end well within 120 s.
void save_on_two(const fs::path& dir, const std::vector<std::string>& ckpt) {
  const int port = free_port();
  std::vector<std::string> args = {"--path", "pipeline",   "--model", "mlp",       "--steps",
                                   "8",      "--shard",    "--fused", "--adam",    "--staleness",
                                   "0",      "--replicas", "buddy",   "--save-at", "5"};
  auto a0 = args, a1 = args;
  a0.insert(a0.end(), {"--ckpt", ckpt[0]});
  a1.insert(a1.end(), {"--ckpt", ckpt[1]});
  Rank r0(dir, 0, 2, port, a0), r1(dir, 1, 2, port, a1);
  CHECK_MESSAGE(r0.wait(std::chrono::seconds(120)) == 0, r0.said());
  CHECK_MESSAGE(r1.wait(std::chrono::seconds(120)) == 0, r1.said());
}

}  // namespace

TEST_CASE(
    "shard replicas (buddy) with a folder per rank: each folder holds the other rank's shard "
    "too, byte for byte its original, rank 0's the manifest, and no probe is left") {
  const fs::path dir = fresh("replicas-own"), a = dir / "A", b = dir / "B";
  fs::create_directories(a);
  fs::create_directories(b);
  save_on_two(dir, {(a / "run").string(), (b / "run").string()});
  const std::string s0 = "run.step5.rank0-of-2", s1 = "run.step5.rank1-of-2";
  CHECK(files_in(a) == std::set<std::string>{"run", s0, s1});
  // Both ranks on one host: rank 1 is not the first of another host, so writes no manifest.
  CHECK(files_in(b) == std::set<std::string>{s0, s1});
  for (const std::string& s : {s0, s1}) {
    CAPTURE(s);
    CHECK(!slurp(a / s).empty());
    CHECK(slurp(a / s) == slurp(b / s));
  }
}

TEST_CASE(
    "shard replicas (buddy) in a folder the ranks share: no replica replaces its rank's flushed "
    "shard (each file is renamed into place once) and no probe is left") {
  const fs::path dir = fresh("replicas-shared"), shared = dir / "S";
  fs::create_directories(shared);
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, shared.c_str(), IN_MOVED_TO) >= 0);
  save_on_two(dir, {(shared / "run").string(), (shared / "run").string()});
  std::map<std::string, int> renamed;
  alignas(inotify_event) char buf[1 << 16];
  for (ssize_t n; (n = ::read(watch, buf, sizeof buf)) > 0;)
    for (const char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      if (e->len) ++renamed[e->name];
      p += sizeof(inotify_event) + e->len;
    }
  ::close(watch);
  const std::map<std::string, int> once = {
      {"run", 1}, {"run.step5.rank0-of-2", 1}, {"run.step5.rank1-of-2", 1}};
  CHECK(renamed == once);
  CHECK(files_in(shared) ==
        std::set<std::string>{"run", "run.step5.rank0-of-2", "run.step5.rank1-of-2"});
}
