// shard_optimizer_state across ranks of ampactor-dist-worker started by ampactor-launch: bit for
// bit the unsharded run (the model on the CPU, and on a GPU), a rank killed mid-run named by the
// other, and a pipeline that shards beside ranks that do not refused on every rank.
#include "dist_fixture.h"
#include "torch_cuda_skip.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace ampactor::test::dist;

namespace {
/// A run on n ranks with `args`, sharded against unsharded: scales, skips, norms and every
/// weight bit for bit, each rank keeping its share of the masters; with --overlap, every rank
/// took speculative steps of its pieces; one step skipped for the inf.
void sharded_as_unsharded(const std::string& name, int n, std::vector<std::string> args) {
  CAPTURE(n);
  CAPTURE(joined(args));
  for (const std::string a :
       {"--path", "pipeline", "--model", "mlp", "--steps", "12", "--print-model"})
    args.push_back(a);
  auto sharded_args = args;
  sharded_args.push_back("--shard");
  const Run plain = launch("unsharded" + name, n, args);
  const Run sharded = launch("sharded" + name, n, sharded_args);
  REQUIRE_MESSAGE(plain.code == 0, plain.log);
  REQUIRE_MESSAGE(sharded.code == 0, sharded.log);
  auto before = [](const std::string& out) { return out.substr(0, out.find("masters ")); };
  auto masters = [](const std::string& out) {
    return std::stoll(out.substr(out.find("masters ") + 8));
  };
  const std::int64_t total = masters(plain.ranks[0]);
  std::int64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(before(sharded.ranks[std::size_t(r)]) == before(plain.ranks[std::size_t(r)]));
    const std::int64_t mine = masters(sharded.ranks[std::size_t(r)]);
    CHECK(mine <= total / n + 1);
    sum += mine;
  }
  CHECK(sum == total);
  for (int r = 0; r < n && joined(args).find("--overlap") != std::string::npos; ++r) {
    const std::string& out = sharded.ranks[std::size_t(r)];
    const auto at = out.find(" taken ");
    REQUIRE_MESSAGE(at != std::string::npos, out);
    CHECK(std::stoll(out.substr(at + 7)) > 0);
  }
  // The sharded run reduce-scatters the gradients (each rank receives its shard's), the
  // unsharded one averages them.
  auto count = [](const std::string& out, const std::string& what) {
    const auto at = out.find(what + " ");
    return at == std::string::npos ? -1 : std::stoi(out.substr(at + what.size() + 1));
  };
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(count(sharded.ranks[std::size_t(r)], "reduce_scatter") > 0);
    CHECK(count(sharded.ranks[std::size_t(r)], "average") == 0);
    CHECK(count(plain.ranks[std::size_t(r)], "average") > 0);
    CHECK(count(plain.ranks[std::size_t(r)], "reduce_scatter") == 0);
  }
  const auto t = trajectory(plain.ranks[0]);
  int skips = 0;
  for (const auto& [scale, skipped] : t)
    skips += skipped;
  CHECK(skips == 1);
}
}  // namespace

TEST_CASE(
    "shard_optimizer_state: bit for bit the unsharded run on 2 and 4 ranks, one rank's inf, "
    "clipping, swap_weights, defer_grad_move and overlap_backward, each rank keeping 1/N of the "
    "masters") {
  struct Setup {
    int n;
    std::vector<std::string> args;
  };
  const std::vector<Setup> setups = {
      {2, {"--staleness", "0", "--fused", "--adam", "--clip", "0.5", "--inf-at", "1:5"}},
      {4, {"--staleness", "1", "--inf-at", "2:4", "--dist-bucket-bytes", "1000"}},  // chunks
      {2, {"--staleness", "1", "--adam", "--clip", "0.5", "--inf-at", "0:7"}},
      {2, {"--staleness", "1", "--defer-move", "--fused", "--adam", "--inf-at", "1:3"}},
      {2, {"--staleness", "1", "--swap", "--fused", "--adam", "--clip", "0.5", "--inf-at", "1:6"}},
      {4, {"--staleness", "1", "--defer", "--fused", "--adam", "--inf-at", "3:5"}},
      // overlap_backward: each bucket's mean as it became ready, the pieces speculated.
      {2,
       {"--staleness", "0", "--fused", "--adam", "--overlap", "--clip", "0.5", "--inf-at", "1:5"}},
      {4, {"--staleness", "0", "--fused", "--overlap", "--inf-at", "2:7"}}};
  for (std::size_t i = 0; i < setups.size(); ++i)
    sharded_as_unsharded(std::to_string(i), setups[i].n, setups[i].args);
}

TEST_CASE(
    "shard_optimizer_state with the model on a GPU (master_device kCPU): bit for bit the unsharded "
    "offload run on 2 ranks, staleness 0 and 1, clipped, one rank's inf") {
  SKIP_WITHOUT_GPU();  // both ranks' models on the one GPU; gloo averages the host copies
  sharded_as_unsharded(
      "-gpu0", 2,
      {"--cuda", "--staleness", "0", "--fused", "--adam", "--clip", "0.5", "--inf-at", "1:5"});
  sharded_as_unsharded("-gpu1", 2, {"--cuda", "--staleness", "1", "--adam", "--inf-at", "0:4"});
}

TEST_CASE(
    "shard_optimizer_state: a rank killed with SIGKILL mid-run is named by the other, which does "
    "not hang in the weights' all-gather (staleness 0, 1, and overlap_backward)") {
  for (const std::string mode : {"0", "1", "0 overlap"}) {
    CAPTURE(mode);
    std::vector<std::string> args = {
        "--path",   "pipeline", "--shard",      "--staleness", mode.substr(0, 1), "--steps", "30",
        "--die-at", "1:5",      "--timeout-ms", "8000"};
    if (mode == "0 overlap") args.insert(args.end(), {"--fused", "--overlap"});
    const Run r = launch("shard-killed", 2, args, 0, std::chrono::seconds(90));
    CHECK(r.code != 0);
    CHECK(r.elapsed < std::chrono::seconds(8 + 30));
    const std::string line = said_by(r.log, 0);
    REQUIRE_MESSAGE(!line.empty(), r.log);
    CHECK_MESSAGE(line.find("failed: rank 1 is gone") != std::string::npos, line);
  }
}

TEST_CASE("a pipeline that shards its state beside ranks that do not is refused, on every rank") {
  const Run r =
      launch("odd-shard", 2,
             {"--path", "pipeline", "--steps", "3", "--rank1-shard", "--timeout-ms", "8000"}, 0,
             std::chrono::seconds(60));
  CHECK(r.code != 0);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const std::string line = said_by(r.log, rank);
    REQUIRE_MESSAGE(!line.empty(), r.log);
    CHECK_MESSAGE(line.find("rank 0 has shard_optimizer_state=off vs shard_optimizer_state=on "
                            "on rank 1") != std::string::npos,
                  line);
  }
}
