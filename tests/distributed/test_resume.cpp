// Resuming a data-parallel run that is not sharded: load_run agrees on the step and the bytes
// across the ranks before anything changes, and resume_run makes one decision for all of them.
#include "dist_fixture.h"

#include <filesystem>

namespace fs = std::filesystem;
using namespace ampactor::test::dist;

namespace {

const std::vector<std::string> kCommon = {"--path",  "pipeline", "--staleness",  "0",
                                          "--steps", "6",        "--timeout-ms", "8000"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

/// Both ranks failed, each saying `what`.
void both_refused(const Run& r, const std::string& what) {
  CHECK(r.code != 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = said_by(r.log, rank);
    CAPTURE(rank);
    CAPTURE(r.log);
    CHECK(line.find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE(
    "load_run with ranks: a rank without the file, or whose copy holds another step, is refused "
    "on every rank, naming it, and copies that agree resume bit for bit") {
  const fs::path dir = fresh("resume-agree");
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  const Run saved = launch("save-a", 2, with(kCommon, {"--save-at", "3", "--ckpt", a}));
  REQUIRE_MESSAGE(saved.code == 0, saved.log);
  REQUIRE(launch("save-b", 2, with(kCommon, {"--save-at", "4", "--ckpt", b})).code == 0);

  const Run resumed = launch("resumed", 2, with(kCommon, {"--resume", "--ckpt", a}));
  REQUIRE_MESSAGE(resumed.code == 0, resumed.log);
  // The iterations after the save, as the saving run had them.
  for (int r = 0; r < 2; ++r) {
    const std::string& all = saved.ranks[std::size_t(r)];
    std::size_t at = 0;
    for (int line = 0; line < 4; ++line)
      at = all.find('\n', at) + 1;
    CHECK(resumed.ranks[std::size_t(r)] == all.substr(at));
  }

  // Rank 1's copy from the save at 4: another step.
  fs::copy_file(b + ".rank1.pt", a + ".rank1.pt", fs::copy_options::overwrite_existing);
  both_refused(launch("other-step", 2, with(kCommon, {"--resume", "--ckpt", a})),
               "rank 1 has step 4 (");
  // Rank 1's copy gone (its host's disk lost it).
  fs::remove(a + ".rank1.pt");
  both_refused(launch("missing", 2, with(kCommon, {"--resume", "--ckpt", a})),
               "rank 1 cannot load it (");
}

TEST_CASE(
    "resume_run with ranks: none has a checkpoint, all start afresh, all have it, all resume, "
    "some have it, every rank is refused naming them") {
  const fs::path dir = fresh("resume-any");
  const std::string c = (dir / "c").string();
  const Run fresh_run = launch("fresh", 2, with(kCommon, {"--resume-any", "--ckpt", c}));
  REQUIRE_MESSAGE(fresh_run.code == 0, fresh_run.log);
  const Run plain = launch("plain", 2, kCommon);
  REQUIRE(plain.code == 0);
  CHECK(fresh_run.ranks == plain.ranks);

  REQUIRE(launch("save", 2, with(kCommon, {"--save-at", "3", "--ckpt", c})).code == 0);
  const Run again = launch("again", 2, with(kCommon, {"--resume-any", "--ckpt", c}));
  REQUIRE_MESSAGE(again.code == 0, again.log);
  const Run resumed = launch("resumed", 2, with(kCommon, {"--resume", "--ckpt", c}));
  REQUIRE(resumed.code == 0);
  CHECK(again.ranks == resumed.ranks);
  CHECK(again.ranks != plain.ranks);

  fs::remove(c + ".rank0.pt");
  both_refused(launch("half", 2, with(kCommon, {"--resume-any", "--ckpt", c})),
               "rank 1 has it, rank 0 does not, so no rank loaded");
}
