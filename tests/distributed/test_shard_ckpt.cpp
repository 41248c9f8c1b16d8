// Checkpoints of sharded runs: save_run's shards and manifest, load_run's agreement across ranks,
// and ampactor-ckpt's check, consolidate and reshard, run as a user runs them.
#include "dist_fixture.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>

namespace fs = std::filesystem;
using namespace ampactor::test::dist;

namespace {

/// The output after its first `n` lines.
std::string after_lines(const std::string& out, int n) {
  std::size_t at = 0;
  for (int line = 0; line < n; ++line)
    at = out.find('\n', at) + 1;
  return out.substr(at);
}

/// The lines of a run's output from iteration `from` on, up to the masters' count (which
/// depends on the world size).
std::string from_iteration(const std::string& out, int from) {
  const std::string rest = after_lines(out, from);
  return rest.substr(0, rest.find("masters "));
}

/// Without the lines that count over the process's life (a resumed one counts from its start):
/// the speculative steps' and the collectives'.
std::string without_overlap(std::string out) {
  for (const char* line : {"overlap_bytes ", "collectives "})
    if (const auto at = out.find(line); at != std::string::npos)
      out.erase(at, out.find('\n', at) + 1 - at);
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::set<std::string> files_in(const fs::path& dir) {
  const auto names = ampactor::test::list_folder(dir.string());
  return {names.begin(), names.end()};
}

}  // namespace

TEST_CASE(
    "shard_optimizer_state: save_run writes each rank's shard and rank 0's manifest and drops the "
    "last save's shards, and a resumed run goes on bit for bit (staleness 0, with "
    "overlap_backward, "
    "and "
    "1 with swap_weights), also after a rank was SIGKILLed") {
  const fs::path dir = fresh("shard-ckpt");
  const std::string ckpt = (dir / "run").string();
  const std::vector<std::string> common = {"--path",  "pipeline", "--model",  "mlp",
                                           "--steps", "12",       "--shard",  "--print-model",
                                           "--fused", "--adam",   "--inf-at", "1:8"};
  for (const std::string mode : {"0", "0 overlap", "1"}) {
    CAPTURE(mode);
    const std::string staleness = mode.substr(0, 1);
    auto args = common;
    args.insert(args.end(), {"--staleness", staleness, "--ckpt", ckpt});
    if (staleness == "1") args.push_back("--swap");  // the spare refilled on load
    if (mode == "0 overlap") args.push_back("--overlap");
    // An earlier save at 2, then the saving run, which goes on to the end: the reference.
    auto early = args, saving = args, resuming = args;
    early.insert(early.end(), {"--save-at", "2"});
    saving.insert(saving.end(), {"--save-at", "5"});
    resuming.push_back("--resume");
    REQUIRE(launch("early", 2, early).code == 0);
    CHECK(files_in(dir).count("run.step2.rank1-of-2") == 1);
    const Run saved = launch("saving", 2, saving);
    REQUIRE_MESSAGE(saved.code == 0, saved.log);
    CHECK(files_in(dir) ==
          std::set<std::string>{"run", "run.step5.rank0-of-2", "run.step5.rank1-of-2"});
    int code = 0;
    std::string said;  // not structured bindings: clang 14 cannot capture those in CHECK's lambda
    std::tie(code, said) = ckpt_tool({"check", ckpt});
    CHECK_MESSAGE(code == 0, said);
    CHECK(said.find("step 5, world 2") != std::string::npos);
    const Run resumed = launch("resumed", 2, resuming);
    REQUIRE_MESSAGE(resumed.code == 0, resumed.log);
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(without_overlap(resumed.ranks[r]) == without_overlap(after_lines(saved.ranks[r], 6)));
    }
    if (mode != "0") continue;
    // A rank SIGKILLed after the save: the run resumes from the save all the same.
    auto killed = saving;
    killed.insert(killed.end(), {"--die-at", "1:8", "--timeout-ms", "8000"});
    CHECK(launch("killed", 2, killed, 0, std::chrono::seconds(90)).code != 0);
    const Run after = launch("after-kill", 2, resuming);
    REQUIRE_MESSAGE(after.code == 0, after.log);
    CHECK(after.ranks == resumed.ranks);
  }
}

TEST_CASE(
    "shard_optimizer_state: a missing or altered shard, on this world size or another, is refused "
    "on every rank naming the rank and the reason, and no rank loads") {
  const fs::path dir = fresh("shard-refused");
  const std::string ckpt = (dir / "run").string();
  std::vector<std::string> args = {"--path", "pipeline", "--staleness",  "0",   "--steps",
                                   "6",      "--shard",  "--timeout-ms", "8000"};
  auto saving = args;
  saving.insert(saving.end(), {"--save-at", "3", "--ckpt", ckpt});
  REQUIRE(launch("saving", 2, saving).code == 0);
  args.push_back("--resume");
  // Each case on a copy of the saved run: its manifest and shards, one of them spoilt.
  auto refused = [&](const std::string& name, int n, const std::string& why,
                     const std::function<void(const fs::path&)>& spoil) {
    CAPTURE(name);
    const fs::path copy = fresh("shard-refused-" + name);
    fs::copy(dir, copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    spoil(copy);
    auto a = args;
    a.insert(a.end(), {"--ckpt", (copy / "run").string()});
    const Run r = launch("refused", n, a, 0, std::chrono::seconds(90));
    CHECK(r.code != 0);
    const std::string said = replace_all(why, "DIR", copy.string());
    for (int rank = 0; rank < n; ++rank) {
      CAPTURE(rank);
      CHECK_MESSAGE(said_by(r.log, rank).find(said) != std::string::npos, r.log);
    }
    return copy;
  };
  const fs::path gone = refused(
      "missing", 2,
      "rank 1 refused its shard, so no rank loaded: its shard file 'DIR/run.step3.rank1-of-2' is "
      "missing",
      [](const fs::path& d) { fs::remove(d / "run.step3.rank1-of-2"); });
  int code = 0;
  std::string said;
  std::tie(code, said) = ckpt_tool({"check", (gone / "run").string()});
  CHECK(code == 1);
  CHECK_MESSAGE(said.find("rank 1: its shard file") != std::string::npos, said);
  refused(
      "altered", 2,
      "rank 0 refused its shard, so no rank loaded: its shard file 'DIR/run.step3.rank0-of-2' "
      "holds ",
      [](const fs::path& d) { std::ofstream(d / "run.step3.rank0-of-2", std::ios::app) << "x"; });
  refused("swapped", 2, "rank 1 refused its shard, so no rank loaded: its shard file", [](auto& d) {
    fs::copy_file(d / "run.step3.rank0-of-2", d / "run.step3.rank1-of-2",
                  fs::copy_options::overwrite_existing);
  });
  // On another number of ranks the save is re-sharded, which needs every shard.
  refused("world", 4,
          "the save at step 3 was sharded over 2 ranks, and rank 1's shard is whole on none of "
          "these 4 (its shard file 'DIR/run.step3.rank1-of-2' is missing",
          [](const fs::path& d) { fs::remove(d / "run.step3.rank1-of-2"); });
}

TEST_CASE(
    "ampactor-ckpt: a run saved on 4 ranks resumes re-sharded on 2 (by the tool, or by load_run "
    "itself) and consolidated on one "
    "process with the same trajectory, an unsharded save resumes sharded, and a re-shard round "
    "trip changes no byte") {
  // The exact model: 4 ranks of 8 samples, 2 of 16 and one of 32 average the same floats.
  const fs::path dir = fresh("reshard");
  const std::string ckpt = (dir / "run").string();
  const std::vector<std::string> common = {"--path",        "pipeline",    "--model", "exact",
                                           "--steps",       "12",          "--fused", "--adam",
                                           "--print-model", "--staleness", "1"};
  auto saving = common;
  saving.insert(saving.end(), {"--shard", "--inf-at", "3:8", "--save-at", "5", "--ckpt", ckpt});
  const Run saved = launch("saved4", 4, saving);
  REQUIRE_MESSAGE(saved.code == 0, saved.log);
  const std::string reference = from_iteration(saved.ranks[0], 6);

  const std::string two = (dir / "two").string(), one = (dir / "one.pt").string();
  int code = 0;
  std::string said;
  std::tie(code, said) = ckpt_tool({"reshard", ckpt, "--world", "2", two});
  REQUIRE_MESSAGE(code == 0, said);
  auto on_two = common;
  on_two.insert(on_two.end(),
                {"--shard", "--batch", "16", "--inf-at", "1:8", "--resume", "--ckpt", two});
  const Run resumed2 = launch("resumed2", 2, on_two);
  REQUIRE_MESSAGE(resumed2.code == 0, resumed2.log);
  CHECK(from_iteration(resumed2.ranks[0], 0) == reference);
  CHECK(from_iteration(resumed2.ranks[1], 0) == reference);
  // load_run on 2 ranks of the 4-rank save itself: re-sharded inside, the same run.
  auto direct = on_two;
  direct.back() = ckpt;
  const Run resumed_direct = launch("resumed-direct", 2, direct);
  REQUIRE_MESSAGE(resumed_direct.code == 0, resumed_direct.log);
  CHECK(resumed_direct.ranks == resumed2.ranks);

  std::tie(code, said) = ckpt_tool({"consolidate", ckpt, one});
  REQUIRE_MESSAGE(code == 0, said);
  // One checkpoint -> 3 shards -> one checkpoint again: the same bytes.
  const std::string three = (dir / "three").string(), again = (dir / "again.pt").string();
  REQUIRE(ckpt_tool({"reshard", one, "--world", "3", three}).first == 0);
  REQUIRE(ckpt_tool({"consolidate", three, again}).first == 0);
  CHECK(slurp(one) == slurp(again));

  // One process resumes the consolidated run, and saves it unsharded at 8 in its turn.
  auto on_one = common;
  on_one.insert(on_one.end(), {"--inf-at", "3:8", "--resume", "--ckpt", one, "--save-at", "8"});
  const Run resumed1 = launch("resumed1", 0, on_one, 4);
  REQUIRE_MESSAGE(resumed1.code == 0, resumed1.log);
  CHECK(from_iteration(resumed1.ranks[0], 0) == reference);

  // That unsharded save, sharded over 2 ranks: they go on from 9 as the 4 ranks did.
  const std::string two9 = (dir / "two9").string();
  REQUIRE(ckpt_tool({"reshard", one, "--world", "2", two9}).first == 0);
  on_two.back() = two9;
  const Run from9 = launch("from9", 2, on_two);
  REQUIRE_MESSAGE(from9.code == 0, from9.log);
  CHECK(from_iteration(from9.ranks[1], 0) == from_iteration(saved.ranks[0], 9));

  // Bad requests: exit 2 for the options, 1 naming what the file is.
  CHECK(ckpt_tool({"reshard", one, "--world", "0", three}).first == 2);
  std::tie(code, said) = ckpt_tool({"consolidate", one, again});
  CHECK(code == 1);
  CHECK_MESSAGE(said.find("is not a sharded run's manifest") != std::string::npos, said);
}

TEST_CASE(
    "shard_optimizer_state: a rank that cannot write its shard makes every rank throw naming it, "
    "and no manifest is written") {
  const fs::path dir = fresh("shard-unwritable");
  const std::string ckpt = (dir / "run").string();
  // A folder where rank 1's shard file would go: its rename onto it fails.
  fs::create_directories(dir / "run.step3.rank1-of-2");
  const Run r = launch("unwritable", 2,
                       {"--path", "pipeline", "--staleness", "0", "--steps", "6", "--shard",
                        "--timeout-ms", "8000", "--save-at", "3", "--ckpt", ckpt});
  CHECK(r.code != 0);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK_MESSAGE(said_by(r.log, rank)
                          .find("save_run '" + ckpt +
                                "': rank 1 could not write its shard, so no "
                                "manifest was written: ") != std::string::npos,
                  r.log);
  }
  CHECK_FALSE(fs::exists(dir / "run"));
}
