// Metrics: the join of the keeper's and the pipeline's reports (driven through a real keeper
// core, one input at a time), the file sinks, and tee_taps.
#include <doctest/doctest.h>

#include <ampactor/keeper/taps.h>
#include <ampactor/metrics/metrics.h>
#include <ampactor/trace/trace.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

using namespace ampactor;

namespace {

GradScalerOptions rule() {
  return GradScalerOptions().init_scale(1024).growth_factor(2).backoff_factor(0.5).growth_interval(
      2);
}

/// One iteration through a keeper core: the scale, one unscale report, the update.
void iterate(KeeperCore& core, iteration_t k, bool inf, std::vector<std::int32_t> ranks = {},
             std::vector<std::string> names = {}) {
  core.handle(1, ScaleRequest{k}, 1);
  UnscaleDone d;
  d.k = k;
  d.optimizer = 7;
  d.found_inf = inf;
  d.local_found_inf = inf;
  d.scale_used = core.state().scale();
  d.found_by = ranks;
  for (const std::string& n : names) {
    OverflowTensor t;
    t.name = n;
    t.inf = true;
    d.overflow.push_back(t);
  }
  core.handle(2, d);
  core.handle(1, UpdateScale{k, 1});
}

std::filesystem::path temp_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// A Metrics writing to memory, with a keeper core that taps it (and a pipeline attached).
struct Joined {
  explicit Joined(MetricsOptions o = {}, bool pipeline = true)
      : metrics(std::make_shared<Metrics>(std::move(o))), mem(std::make_shared<MemoryMetrics>()) {
    metrics->sink(mem);
    core = std::make_unique<KeeperCore>(rule(), ScalePolicy::exact, metrics);
    if (pipeline) metrics->attached();
  }
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<MemoryMetrics> mem;
  std::unique_ptr<KeeperCore> core;
};

struct Throwing final : MetricsSink {
  void write(const IterationMetrics&) override { throw std::runtime_error("disk on fire"); }
};

}  // namespace

TEST_CASE("metrics: one record per iteration holds what the keeper applied, in order") {
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  metrics->sink(mem);
  KeeperCore core(rule(), ScalePolicy::exact, metrics);
  iterate(core, 0, false);
  iterate(core, 1, true, {0, 2}, {"fc1.weight", "fc2.bias"});
  iterate(core, 2, false);
  iterate(core, 3, false);
  REQUIRE(mem->records.size() == 4);
  const auto& r = mem->records;
  for (int k = 0; k < 4; ++k)
    CHECK(r[k].k == k);
  CHECK(r[0].scale_used == 1024);
  CHECK(r[0].scale == 1024);
  CHECK(r[0].growth_tracker == 1);
  CHECK_FALSE(r[0].skipped);
  CHECK(r[1].found_inf);
  CHECK(r[1].skipped);
  CHECK(r[1].backed_off);
  CHECK(r[1].scale_used == 1024);
  CHECK(r[1].scale == 512);
  CHECK(r[1].growth_tracker == 0);
  CHECK(r[1].backoffs_in_row == 1);
  CHECK(r[1].found_by == std::vector<std::int32_t>{0, 2});
  CHECK(r[1].overflow == std::vector<std::string>{"fc1.weight", "fc2.bias"});
  CHECK(r[3].grew);
  CHECK(r[3].scale == 1024);
  CHECK(r[3].backoffs_in_row == 0);
  // No pipeline attached: its figures are not measured, and the records are complete.
  CHECK(std::isnan(r[2].trainer_wait_s));
  CHECK(std::isnan(r[2].grad_norm));
  CHECK(r[2].complete);
  CHECK(r[2].wall_time > 1.6e9);
}

TEST_CASE(
    "metrics: with a pipeline attached a record waits for its trainer and optimizer reports") {
  Joined j;
  Metrics& metrics = *j.metrics;
  const MemoryMetrics& mem = *j.mem;
  KeeperCore& core = *j.core;
  iterate(core, 0, false);
  CHECK(mem.records.empty());  // the keeper's part alone
  metrics.trainer_step(0, 0.25, std::nan(""));
  CHECK(mem.records.empty());  // the optimizer's still to come
  metrics.optimizer_step(0, 0.5, 3.0);
  REQUIRE(mem.records.size() == 1);
  CHECK(mem.records[0].trainer_wait_s == 0.25);
  CHECK(mem.records[0].optimizer_step_s == 0.5);
  CHECK(mem.records[0].grad_norm == 3.0);
  CHECK(mem.records[0].complete);
  // Reports before the keeper's update (staleness 0's order) join it too.
  metrics.trainer_step(1, 0.125, 0.75);
  metrics.optimizer_step(1, 0.0625, std::nan(""));
  CHECK(mem.records.size() == 1);
  iterate(core, 1, false);
  REQUIRE(mem.records.size() == 2);
  CHECK(mem.records[1].iteration_s == 0.75);
  CHECK(std::isnan(mem.records[1].grad_norm));
}

TEST_CASE("metrics: a record whose step never reports goes out incomplete after max_pending") {
  Joined j(MetricsOptions().max_pending(2));
  Metrics& metrics = *j.metrics;
  const MemoryMetrics& mem = *j.mem;
  KeeperCore& core = *j.core;
  iterate(core, 0, false);  // its step job failed: no optimizer report ever comes
  metrics.trainer_step(0, 0.1, std::nan(""));
  for (iteration_t k = 1; k <= 2; ++k) {
    metrics.trainer_step(k, 0.1, 0.2);
    metrics.optimizer_step(k, 0.1, std::nan(""));
    iterate(core, k, false);
  }
  // Iteration 2's reports aged iteration 0 out; 1 and 2 follow in order.
  REQUIRE(mem.records.size() == 3);
  CHECK_FALSE(mem.records[0].complete);
  CHECK(std::isnan(mem.records[0].optimizer_step_s));
  CHECK(mem.records[1].complete);
  CHECK(mem.records[2].k == 2);
}

TEST_CASE("metrics: close writes what is pending and drops later reports") {
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  metrics->sink(mem);
  {
    KeeperCore core(rule(), ScalePolicy::exact, metrics);
    metrics->attached();
    iterate(core, 0, false);
    CHECK(mem->records.empty());
  }  // the core's stop closes the metrics
  REQUIRE(mem->records.size() == 1);
  CHECK_FALSE(mem->records[0].complete);
  metrics->optimizer_step(0, 0.1, 1.0);
  metrics->close();
  CHECK(mem->records.size() == 1);
  CHECK(metrics->written() == 1);
}

TEST_CASE("metrics: bad options and null sinks are refused") {
  CHECK_THROWS_WITH_AS(MetricsOptions().max_pending(0),
                       "MetricsOptions: max_pending must be >= 1, got 0", ScalerError);
  Metrics m;
  CHECK_THROWS_AS(m.sink(nullptr), ScalerError);
  CHECK_THROWS_AS(JsonlMetrics("/nonexistent-dir/x.jsonl"), ScalerError);
  CHECK_THROWS_AS(CsvMetrics("/nonexistent-dir/x.csv"), ScalerError);
}

TEST_CASE("metrics: a sink that throws is dropped alone and failure() says why") {
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  metrics->sink(std::make_shared<Throwing>()).sink(mem);
  KeeperCore core(rule(), ScalePolicy::exact, metrics);
  iterate(core, 0, false);
  iterate(core, 1, false);
  CHECK(mem->records.size() == 2);
  CHECK(metrics->failure() == "metrics sink dropped: disk on fire");
}

TEST_CASE("metrics: the JSON lines and the CSV hold every record's values") {
  const auto dir = temp_dir("ampactor-metrics-files");
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  metrics->sink(std::make_shared<JsonlMetrics>((dir / "m.jsonl").string()))
      .sink(std::make_shared<CsvMetrics>((dir / "m.csv").string()))
      .sink(mem);
  {
    KeeperCore core(rule(), ScalePolicy::exact, metrics);
    iterate(core, 0, false);
    iterate(core, 1, true, {1}, {"a,\"b\""});
    iterate(core, 2, false);
  }
  REQUIRE(mem->records.size() == 3);
  std::ifstream jsonl(dir / "m.jsonl");
  std::string line;
  std::size_t n = 0;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    const IterationMetrics& r = mem->records.at(n++);
    CHECK(j["k"] == r.k);
    CHECK(j["scale"].get<float>() == r.scale);
    CHECK(j["scale_used"].get<float>() == r.scale_used);
    CHECK(j["skipped"] == r.skipped);
    CHECK(j["growth_tracker"] == r.growth_tracker);
    CHECK(j["found_by"].get<std::vector<std::int32_t>>() == r.found_by);
    CHECK(j["overflow"].get<std::vector<std::string>>() == r.overflow);
    CHECK(j["grad_norm"].is_null());
    CHECK(j["wall_time"].get<double>() == r.wall_time);
  }
  CHECK(n == 3);
  std::ifstream csv(dir / "m.csv");
  std::getline(csv, line);
  CHECK(line == csv_header());
  for (const IterationMetrics& r : mem->records) {
    std::getline(csv, line);
    CHECK(line == to_csv_row(r));
  }
  CHECK(to_csv_row(mem->records[1]).find(",1,\"a,\"\"b\"\"\",") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("tee_taps: each tap sees every message, and one that throws is dropped alone") {
  struct Counting final : KeeperTap {
    int in = 0, out = 0, stops = 0;
    bool throws = false;
    void started(const GradScalerOptions&, ScalePolicy) override {}
    void input(peer_id, const KeeperInput&) override {
      if (throws && in == 1) throw std::runtime_error("broken tap");
      ++in;
    }
    void output(const KeeperOutput&) override { ++out; }
    void stopped() override { ++stops; }
  };
  auto a = std::make_shared<Counting>(), b = std::make_shared<Counting>();
  b->throws = true;
  auto buffer = std::make_shared<TraceBuffer>();
  auto trace = std::make_shared<TraceRecorder>(buffer);
  auto tee = tee_taps({a, b, trace});
  {
    KeeperCore core(rule(), ScalePolicy::exact, tee);
    iterate(core, 0, false);
    iterate(core, 1, false);
  }
  CHECK(a->in == 6);   // ScaleRequest, UnscaleDone, UpdateScale a time
  CHECK(a->out == 4);  // ScaleReply, UpdateApplied a time
  CHECK(a->stops == 1);
  CHECK(b->in == 1);  // dropped at its second input
  CHECK(b->stops == 0);
  CHECK(buffer->events.size() == 10);
  CHECK(tee->failure() == "tap dropped: broken tap");
  CHECK_THROWS_AS(tee_taps({a, nullptr}), ScalerError);
}
