// A sharded run's manifest trusted no further than it can be checked: whole shards of two saves,
// an edited step, a FIFO or /dev/zero where a file should be, negative sizes, and a re-shard
// onto an absurd world, each refused at once by name by load_run and by ampactor-ckpt.
#include "dist_fixture.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace ampactor::test::dist;

namespace {

const std::vector<std::string> kArgs = {"--path", "pipeline", "--staleness",  "0",   "--steps",
                                        "6",      "--shard",  "--timeout-ms", "8000"};

/// Two ranks' run saved at `step` into DIR/run.
fs::path saved_at(const std::string& name, int step) {
  const fs::path dir = fresh(name);
  auto a = kArgs;
  a.insert(a.end(), {"--save-at", std::to_string(step), "--ckpt", (dir / "run").string()});
  REQUIRE(launch(name + "-save", 2, a).code == 0);
  return dir;
}

nlohmann::json manifest(const fs::path& dir) {
  return nlohmann::json::parse(slurp(dir / "run"));
}
void write_manifest(const fs::path& dir, const nlohmann::json& j) {
  std::ofstream(dir / "run") << j.dump(1) << "\n";
}

/// A resume from DIR/run on two ranks: every rank's output must hold `why`.
void resume_refused(const fs::path& dir, const std::string& why) {
  auto a = kArgs;
  a.insert(a.end(), {"--resume", "--ckpt", (dir / "run").string()});
  const Run r = launch("trust-resume", 2, a, 0, std::chrono::seconds(90));
  CHECK(r.code != 0);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK_MESSAGE(said_by(r.log, rank).find(why) != std::string::npos, r.log);
  }
}

}  // namespace

TEST_CASE(
    "ampactor-ckpt check and load_run refuse a manifest naming whole shards of two saves, and an "
    "edited step, naming the rank and both steps") {
  const fs::path early = saved_at("trust-early", 2), late = saved_at("trust-late", 5);
  // Rank 1's entry: the step-2 save's shard, its true size and digest.
  nlohmann::json j = manifest(late);
  j["shards"][1] = manifest(early)["shards"][1];
  fs::copy_file(early / "run.step2.rank1-of-2", late / "run.step2.rank1-of-2");
  write_manifest(late, j);
  const std::string why = "its shard file '" + (late / "run.step2.rank1-of-2").string() +
                          "' holds step 2, the manifest step 5";
  const std::pair<int, std::string> got_code = ckpt_tool({"check", (late / "run").string()});
  const int code = got_code.first;  // not a binding: clang 14 cannot capture one
  const std::string said = got_code.second;
  CHECK(code == 1);
  CHECK_MESSAGE(said.find("rank 1: " + why) != std::string::npos, said);
  resume_refused(late, "rank 1 refused its shard, so no rank loaded: " + why);

  // The step edited, the shards left as they were.
  const fs::path edited = saved_at("trust-edited", 5);
  nlohmann::json e = manifest(edited);
  e["step"] = 4;
  write_manifest(edited, e);
  const std::pair<int, std::string> got_code2 = ckpt_tool({"check", (edited / "run").string()});
  const int code2 = got_code2.first;
  const std::string said2 = got_code2.second;
  CHECK(code2 == 1);
  CHECK_MESSAGE(said2.find("rank 0: its shard file") != std::string::npos, said2);
  CHECK_MESSAGE(said2.find("holds step 5, the manifest step 4") != std::string::npos, said2);
  resume_refused(edited, "holds step 5, the manifest step 4");
}

TEST_CASE(
    "ampactor-ckpt refuses a FIFO shard, a manifest linked to /dev/zero and negative sizes at "
    "once, and a re-shard onto more ranks than elements before writing anything") {
  const fs::path dir = saved_at("trust-files", 3);
  const std::string run = (dir / "run").string();
  const fs::path shard = dir / "run.step3.rank1-of-2";
  const fs::path kept = dir / "kept-shard";
  fs::rename(shard, kept);
  REQUIRE(::mkfifo(shard.c_str(), 0600) == 0);
  for (const char* command : {"check", "consolidate", "reshard"}) {
    CAPTURE(command);
    std::vector<std::string> args = {command, run};
    if (std::string(command) == "consolidate") args.push_back((dir / "one.pt").string());
    if (std::string(command) == "reshard")
      args.insert(args.end(), {"--world", "1", (dir / "re").string()});
    const std::pair<int, std::string> got_code = ckpt_tool(args);
    const int code = got_code.first;
    const std::string said = got_code.second;
    CHECK(code == 1);
    CHECK_MESSAGE(
        said.find("'" + shard.string() + "' is a FIFO, not a regular file") != std::string::npos,
        said);
  }
  fs::remove(shard);
  fs::rename(kept, shard);

  const fs::path zero = dir / "zero";
  fs::create_symlink("/dev/zero", zero);
  const std::pair<int, std::string> got_code = ckpt_tool({"check", zero.string()});
  const int code = got_code.first;
  const std::string said = got_code.second;
  CHECK(code == 1);
  CHECK_MESSAGE(said.find("is a character device, not a regular file") != std::string::npos, said);

  const std::string text = slurp(dir / "run");
  nlohmann::json j = nlohmann::json::parse(text);
  auto& shape = j["shapes"][0];
  REQUIRE(shape.size() == 2);
  shape[0] = -shape[0].get<std::int64_t>(), shape[1] = -shape[1].get<std::int64_t>();
  write_manifest(dir, j);
  const std::pair<int, std::string> got_code2 = ckpt_tool({"check", run});
  const int code2 = got_code2.first;
  const std::string said2 = got_code2.second;
  CHECK(code2 == 1);
  CHECK_MESSAGE(said2.find("parameter 0's shape has a negative size") != std::string::npos, said2);
  std::ofstream(dir / "run") << text;

  const std::pair<int, std::string> got_code3 =
      ckpt_tool({"reshard", run, "--world", "2147483647", (dir / "huge").string()});
  const int code3 = got_code3.first;
  const std::string said3 = got_code3.second;
  CHECK(code3 == 2);
  CHECK_MESSAGE(said3.find("world 2147483647 is more ranks than the run's") != std::string::npos,
                said3);
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK_MESSAGE(entry.path().filename().string().rfind("huge", 0) != 0, entry.path());
}
