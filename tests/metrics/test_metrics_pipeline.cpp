// Metrics on a real run: a GradScaler and an AsyncOptimizer reporting to one Metrics beside a
// trace; the records hold what the keeper's messages say and what the pipeline measured.
#include <doctest/doctest.h>

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/keeper/taps.h>
#include <ampactor/metrics/metrics.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/trace.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "metrics_run.h"

using namespace ampactor;

TEST_CASE("metrics on a pipeline: each record is the keeper's update and the pipeline's clocks") {
  for (int staleness : {0, 1}) {
    CAPTURE(staleness);
    auto metrics = std::make_shared<Metrics>();
    auto mem = std::make_shared<MemoryMetrics>();
    metrics->sink(mem);
    auto buffer = std::make_shared<TraceBuffer>();
    std::vector<double> norms;
    test::metrics_run(/*iterations=*/12, staleness,
                      tee_taps({std::make_shared<TraceRecorder>(buffer), metrics}), metrics,
                      &norms);
    REQUIRE(mem->records.size() == 12);
    // The trace's UpdateApplied, by iteration: what the keeper sent.
    std::map<iteration_t, UpdateApplied> applied;
    std::map<iteration_t, float> made_at;  // the optimizer's UnscaleDone: the gradients' scale
    for (const TraceEvent& e : buffer->events) {
      if (const auto* u = std::get_if<UpdateApplied>(&e.msg)) applied[u->k] = *u;
      if (const auto* d = std::get_if<UnscaleDone>(&e.msg)) made_at[d->k] = d->scale_used;
    }
    REQUIRE(applied.size() == 12);
    int skipped = 0;
    for (const IterationMetrics& r : mem->records) {
      CAPTURE(r.k);
      const UpdateApplied& u = applied.at(r.k);
      CHECK(r.scale == u.scale);
      CHECK(r.scale_used > 0);
      CHECK(r.scale_used == made_at.at(r.k));
      CHECK(r.growth_tracker == u.growth_tracker);
      CHECK(r.found_inf == u.found_inf);
      CHECK(r.backoffs_in_row == u.guard.backoffs_in_row);
      CHECK(r.complete);
      CHECK(r.trainer_wait_s >= 0);
      CHECK(r.optimizer_step_s >= 0);
      CHECK(r.optimizer_step_s < 60);
      if (r.k > 0) CHECK(r.iteration_s > 0);
      skipped += r.skipped;
      if (r.found_inf) {
        CHECK(r.overflow == std::vector<std::string>{"b"});
        CHECK(std::isnan(r.grad_norm));
      } else {
        CHECK(r.grad_norm == norms.at(r.k));
      }
    }
    CHECK(skipped == test::metrics_run_overflows(12));
  }
}

TEST_CASE("a pipeline tap that throws is told nothing more and the steps go on") {
  struct Throwing final : PipelineTap {
    int attaches = 0, trainer = 0, optimizer = 0, detaches = 0;
    void attached() override { ++attaches; }
    void detached() override { ++detaches; }
    void trainer_step(std::int64_t, double, double) override {
      ++trainer;
      throw std::runtime_error("tap broke");
    }
    void optimizer_step(std::int64_t, double, double) override { ++optimizer; }
  };
  auto tap = std::make_shared<Throwing>();
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  metrics->sink(mem);
  test::metrics_run(/*iterations=*/6, /*staleness=*/0, metrics, tap);
  CHECK(tap->attaches == 1);
  CHECK(tap->trainer == 1);    // dropped at its first throw
  CHECK(tap->optimizer == 1);  // iteration 0's step ended before step() returned
  CHECK(tap->detaches == 0);
  REQUIRE(mem->records.size() == 6);  // the keeper's records, every step made
  for (const IterationMetrics& r : mem->records)
    CHECK(r.scale > 0);
}
