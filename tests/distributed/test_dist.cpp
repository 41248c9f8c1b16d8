// Data parallel over c10d's gloo on loopback: ranks of ampactor-dist-worker started by
// ampactor-launch (a free port each time, so parallel tests cannot collide), their outputs
// compared with each other and with one process over the concatenated batch.
#include "dist_fixture.h"

#include <ampactor/trace/replay.h>
#include <ampactor/trace/trace.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace ampactor;
using ampactor::test::Child;
using namespace ampactor::test::dist;

namespace {

const std::vector<std::vector<std::string>> kPaths = {
    {"--path", "local"},
    {"--path", "actor"},
    {"--path", "pipeline", "--staleness", "0"},
    {"--path", "pipeline", "--staleness", "1", "--defer"}};

/// f(n, path's arguments) for 2 and 4 ranks on every path.
template <class F>
void for_each_setup(F&& f) {
  for (int n : {2, 4})
    for (const auto& path : kPaths) {
      CAPTURE(n);
      CAPTURE(joined(path));
      f(n, path);
    }
}

}  // namespace

TEST_CASE("2 and 4 ranks: the same scale and skips and bit-identical parameters on every rank") {
  for_each_setup([](int n, std::vector<std::string> args) {
    args.insert(args.end(), {"--model", "mlp", "--steps", "16", "--inf-at", "1:6"});
    const Run r = launch("same", n, args);
    REQUIRE_MESSAGE(r.code == 0, r.log);
    REQUIRE(r.ranks[0].find("done") != std::string::npos);
    for (int i = 1; i < n; ++i)
      CHECK(r.ranks[std::size_t(i)] == r.ranks[0]);
  });
}

TEST_CASE("an inf on one rank only makes every rank skip and back off exactly once") {
  for_each_setup([](int n, std::vector<std::string> args) {
    // growth interval 100: no growth in 12 steps, so a scale change is the backoff.
    args.insert(args.end(), {"--steps", "12", "--growth-interval", "100", "--inf-at",
                             std::to_string(n - 1) + ":5"});
    const Run r = launch("one-inf", n, args);
    REQUIRE_MESSAGE(r.code == 0, r.log);
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      const auto t = trajectory(r.ranks[std::size_t(i)]);
      REQUIRE(t.size() == 12);
      int skips = 0, backoffs = 0;
      for (std::size_t k = 0; k < t.size(); ++k) {
        skips += t[k].second;
        if (k > 0 && t[k].first < t[k - 1].first) ++backoffs;
      }
      CHECK(t[5].second == 1);
      CHECK(skips == 1);
      CHECK(backoffs == 1);
      CHECK(t[6].first == t[5].first / 2);
    }
  });
}

TEST_CASE("data parallel equals one process over the concatenated batch, bit for bit (SGD)") {
  // The exact model: every gradient and every mean of them is exact in fp32 (dist_worker.cpp),
  // so the ranks' average and the concatenated batch's mean are the same floats.
  for_each_setup([](int n, std::vector<std::string> args) {
    args.insert(args.end(), {"--model", "exact", "--steps", "24", "--inf-at", "0:9"});
    const Run dp = launch("dp", n, args);
    const Run one = launch("single", 0, args, n);
    REQUIRE_MESSAGE(dp.code == 0, dp.log);
    REQUIRE_MESSAGE(one.code == 0, one.log);
    CHECK(trajectory(dp.ranks[0]).size() == 24);
    CHECK(dp.ranks[0] == one.ranks[0]);
  });
}

TEST_CASE(
    "average and reduce_scatter on 2, 3 and 4 ranks: the mean summed in rank order, uneven and "
    "empty cuts, the maxima agreed, bad bounds refused, also in buckets and chunks of 400 bytes, "
    "and shift's bytes around the ring, whole and in pieces") {
  // The last run: 400-byte buckets, so that average makes several and reduce_scatter cuts its
  // part into chunks that cross the ranks' cuts.
  const std::vector<std::pair<int, std::string>> runs = {{2, ""}, {3, ""}, {4, ""}, {4, "400"}};
  for (const auto& run : runs) {
    const int n = run.first;
    const std::string& bucket = run.second;
    CAPTURE(n);
    CAPTURE(bucket);
    std::vector<std::string> args = {"--path", "collectives"};
    if (!bucket.empty()) args.insert(args.end(), {"--dist-bucket-bytes", bucket});
    const Run r = launch("collectives", n, args);
    REQUIRE_MESSAGE(r.code == 0, r.log);
    for (int rank = 0; rank < n; ++rank) {
      CAPTURE(rank);
      const std::string& out = r.ranks[std::size_t(rank)];
      // The values are such that another order of the sum gives other floats (with two ranks
      // there is one order).
      const std::string order = n == 2 ? "no" : "yes";
      CHECK_MESSAGE(out.find("order matters " + order + "\n") != std::string::npos, out);
      for (const std::string check :
           {"average", "reduce_scatter", "empty", "refused", "shift", "shift_pieces"})
        CHECK_MESSAGE(out.find(check + " ok\n") != std::string::npos, out);
      CHECK(out.find("FAILED") == std::string::npos);
    }
  }
}

TEST_CASE(
    "overlap_backward with 2 ranks: bit for bit staleness 0's ranks, clipped, one rank's inf") {
  // Each bucket is averaged as it becomes ready; with 2 ranks a sum has one order, so the means
  // are the whole-gradient average's floats (more ranks: the order follows the buckets).
  const std::vector<std::string> args = {"--path",  "pipeline", "--staleness", "0",  "--fused",
                                         "--model", "mlp",      "--steps",     "16", "--inf-at",
                                         "1:6",     "--clip",   "0.5"};
  std::vector<std::string> overlapped = args;
  overlapped.push_back("--overlap");
  const Run ov = launch("overlap", 2, overlapped), ref = launch("overlap-ref", 2, args);
  REQUIRE_MESSAGE(ov.code == 0, ov.log);
  REQUIRE_MESSAGE(ref.code == 0, ref.log);
  CHECK(ov.ranks[1] == ov.ranks[0]);
  const std::string bytes = "overlap_bytes ";
  const auto at = ov.ranks[0].find(bytes);
  REQUIRE(at != std::string::npos);
  CHECK(std::stoll(ov.ranks[0].substr(at + bytes.size())) > 0);  // buckets were speculated
  CHECK(ov.ranks[0].substr(0, at) + "done\n" == ref.ranks[0]);
  // Skipped at 6 on both ranks; the norm (the last column) above 0.5 in some steps, not others.
  std::istringstream in(ref.ranks[0]);
  int k = 0, clipped = 0, unclipped = 0;
  for (std::string line; std::getline(in, line) && k < 16; ++k) {
    std::istringstream l(line);
    double scale = 0, norm = 0;
    int kk = 0, skipped = 0;
    l >> kk >> scale >> skipped;
    CHECK(skipped == (k == 6));
    if (k == 6) continue;
    l >> norm;
    (norm > 0.5 ? clipped : unclipped)++;
  }
  CHECK(clipped >= 3);
  CHECK(unclipped >= 3);
}

TEST_CASE(
    "each rank's trace records its local and the agreed found_inf and the rank that found it, and "
    "replays identically") {
  // The pipeline: each rank checks its own gradients in the move, before they are averaged; the
  // overlapped backward bucket by bucket. The actor path's worker averages the gradients itself
  // before the scaler's unscale (as DDP does), so there both ranks' own checks find the inf.
  const std::vector<std::vector<std::string>> paths = {
      {"--path", "pipeline", "--staleness", "0"},
      {"--path", "actor"},
      {"--path", "pipeline", "--staleness", "0", "--fused", "--model", "mlp", "--overlap"}};
  for (std::size_t i = 0; i < paths.size(); ++i) {
    CAPTURE(joined(paths[i]));
    const fs::path dir = fresh("traces" + std::to_string(i));
    auto args = paths[i];
    for (const std::string a : {"--print-overflow", "--steps", "10", "--inf-at", "1:4", "--trace"})
      args.push_back(a);
    args.push_back((dir / "t").string());
    const Run r = launch("trace" + std::to_string(i), 2, args);
    REQUIRE_MESSAGE(r.code == 0, r.log);
    for (int rank : {0, 1}) {
      CAPTURE(rank);
      const Trace t = read_trace((dir / ("t.rank" + std::to_string(rank) + ".jsonl")).string());
      CHECK(replay_trace(t).identical);
      int reports = 0;
      for (const auto& e : t.events)
        if (const auto* d = std::get_if<UnscaleDone>(&e.msg)) {
          ++reports;
          CHECK(d->found_inf == (d->k == 4));
          const bool actor = i == 1;
          CHECK(d->local_found_inf == (d->k == 4 && (rank == 1 || actor)));
          const std::vector<std::int32_t> by =
              actor ? std::vector<std::int32_t>{0, 1} : std::vector<std::int32_t>{1};
          CHECK(d->found_by == (d->k == 4 ? by : std::vector<std::int32_t>{}));
        }
      CHECK(reports == 10);
      // GradScaler::last_overflow() names it too.
      const std::string named =
          i == 1 ? "last_overflow 4 ranks 0 1\n" : "last_overflow 4 ranks 1\n";
      CHECK_MESSAGE(r.ranks[rank].find(named) != std::string::npos, r.ranks[rank]);
      const LayerReport layers = layer_overflows(t);
      REQUIRE(layers.ranks.size() == (i == 1 ? 2 : 1));
      CHECK(layers.ranks.back() == std::pair<std::int32_t, std::int64_t>{1, 1});
    }
  }
}

TEST_CASE("a rank whose step job throws makes every other rank fail naming it and the reason") {
  for (const auto& path :
       {std::vector<std::string>{"--path", "actor"},
        std::vector<std::string>{"--path", "pipeline", "--defer"},
        std::vector<std::string>{"--path", "pipeline", "--shard", "--staleness", "1"},
        std::vector<std::string>{"--path", "pipeline", "--staleness", "0"},  // a waited job
        std::vector<std::string>{"--path", "pipeline", "--shard", "--staleness", "0", "--fused",
                                 "--overlap"}}) {
    CAPTURE(joined(path));
    auto args = path;
    args.insert(args.end(), {"--steps", "30", "--throw-at", "1:3", "--timeout-ms", "8000"});
    const Run r = launch("throws", 3, args, 0, std::chrono::seconds(90));
    CHECK(r.code != 0);
    for (int rank : {0, 2}) {
      CAPTURE(rank);
      const std::string line = said_by(r.log, rank);
      REQUIRE_MESSAGE(!line.empty(), r.log);
      CHECK_MESSAGE(line.find("rank 1 failed: its step job in iteration 3 threw: an error in rank "
                              "1's step") != std::string::npos,
                    line);
    }
  }
}

TEST_CASE("ranks started with different scaler options are refused at start, on every rank") {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c :
       {Case{{"--rank1-growth-interval", "5"},
             "rank 0 has growth_interval=3 vs growth_interval=5 on rank 1"},
        Case{{"--rank1-policy", "lagged"}, "rank 0 has policy=exact vs policy=lagged on rank 1"},
        Case{{"--rank1-init-scale", "2048"}, "rank 0 has init_scale=1024 vs init_scale=2048"},
        Case{{"--rank1-growth-factor", "4"}, "rank 0 has growth_factor=2 vs growth_factor=4"},
        Case{{"--rank1-rule", "megatron"}, "rank 0 has rule=torch vs rule=megatron"}}) {
    CAPTURE(c.says);
    auto args = c.args;
    args.insert(args.end(), {"--path", "actor", "--steps", "3"});
    const Run r = launch("options", 2, args);
    CHECK(r.code != 0);
    for (int rank : {0, 1}) {
      const std::string line = said_by(r.log, rank);
      REQUIRE_MESSAGE(!line.empty(), r.log);
      CHECK_MESSAGE(line.find(c.says) != std::string::npos, line);
      CHECK(r.ranks[std::size_t(rank)].empty());  // refused before the first iteration
    }
  }
}

TEST_CASE("a rank whose store cannot be reached fails with the store's error") {
  // Rank 1 of 2 with nobody at the port: the TCPStore client gives up after the timeout.
  ::setenv("RANK", "1", 1), ::setenv("WORLD_SIZE", "2", 1), ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "9", 1);  // discard: nothing listens there
  const fs::path dir = fresh("unreachable");
  int code = -1;
  {
    Child c({AMPACTOR_DIST_WORKER, "--out", dir.string(), "--timeout-ms", "1500"},
            (dir / "log.txt").string());
    code = c.wait(std::chrono::seconds(60));
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(v);
  const std::string log = slurp(dir / "log.txt");
  CHECK(code == 1);
  CHECK_MESSAGE(log.find("rank 1: the store at 127.0.0.1:9 cannot be reached (rank 0 hosts it)") !=
                    std::string::npos,
                log);
}

TEST_CASE("ampactor-launch: torchrun's variables, the failing ranks named, bad options refused") {
  const fs::path dir = fresh("launch");
  auto run = [&](std::vector<std::string> argv) {
    Child c(argv, (dir / "out.txt").string());
    const int code = c.wait(std::chrono::seconds(30));
    return std::make_pair(code, slurp(dir / "out.txt"));
  };
  auto [code, out] = run({AMPACTOR_LAUNCH, "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
                          "--master-addr", "10.0.0.1", "--master-port", "29999", "--", "sh", "-c",
                          "echo vars $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                          "$MASTER_PORT"});
  CHECK(code == 0);
  CHECK(out.find("vars 2 4 0 2 10.0.0.1 29999") != std::string::npos);
  CHECK(out.find("vars 3 4 1 2 10.0.0.1 29999") != std::string::npos);
  std::tie(code, out) = run({AMPACTOR_LAUNCH, "--nproc", "3", "--", "sh", "-c", "exit $RANK"});
  CHECK(code != 0);
  CHECK(out.find("ampactor-launch: rank 1 exited with code 1") != std::string::npos);
  CHECK(out.find("ampactor-launch: rank 2 exited with code 2") != std::string::npos);
  CHECK(out.find("rank 0 exited") == std::string::npos);
  std::tie(code, out) =
      run({AMPACTOR_LAUNCH, "--nproc", "1", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  CHECK(code == 2);
  CHECK(out.find("--node-rank 2 must be below --nnodes 2") != std::string::npos);
  std::tie(code, out) = run({AMPACTOR_LAUNCH, "--nproc", "2", "--", "/nonexistent/program"});
  CHECK(code == 2);
  CHECK(out.find("cannot start /nonexistent/program") != std::string::npos);
}
