// Per-iteration figures of a training run, for the tools people already watch: one record per
// iteration, joined from what the scale keeper reports (a KeeperTap: the scale, the overflow and
// who found it, the growth tracker, the collapse guard) and what the pipeline reports (a
// PipelineTap: the trainer's wait, the optimizer's step time, the gradient norm). No second
// source of truth: the figures are the keeper's messages and the pipeline's clocks. Sinks write
// the records: JSON lines and CSV here, TensorBoard (<ampactor/metrics/tensorboard.h>) and
// Prometheus (<ampactor/metrics/prometheus.h>) beside. doc/guide/metrics.md has the tags.
//
//   auto metrics = std::make_shared<ampactor::Metrics>();
//   metrics->sink(std::make_shared<ampactor::JsonlMetrics>("run/metrics.jsonl"));
//   ampactor::GradScaler scaler(system, opts, ampactor::KeeperOptions().tap(metrics));
//   ampactor::AsyncOptimizer pipe(params, scaler, ampactor::AsyncOptimizerOptions().tap(metrics));
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ampactor/core/pipeline_tap.h>
#include <ampactor/keeper/keeper_core.h>

namespace ampactor {

/// One iteration. NaN: not measured (no pipeline reports it, or its step never ran).
struct IterationMetrics {
  iteration_t k = 0;
  double wall_time = 0;    // seconds since the epoch, when the keeper applied the update
  float scale_used = 0;    // the scale iteration k's loss was scaled with (0: none asked)
  float scale = 0;         // the scale after update k (what DeepSpeed and Megatron log)
  bool found_inf = false;  // some gradient of k held inf or NaN (all ranks agreed)
  bool skipped = false;    // the optimizer step was skipped for it
  bool abandoned = false;  // a job failed or was cancelled: update k changed nothing
  bool backed_off = false, grew = false;
  std::int64_t growth_tracker = 0;
  std::int64_t backoffs_in_row = 0;    // the collapse guard's count
  bool collapsing = false;             // the collapse guard tripped
  std::vector<std::int32_t> found_by;  // data parallel: the ranks whose check found inf/NaN
  std::vector<std::string> overflow;   // the gradients that held inf or NaN, by name
  static constexpr double none = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = none;         // clip_grad_norm's total norm before clipping
  double trainer_wait_s = none;    // how long step() held the trainer
  double optimizer_step_s = none;  // the step's time on the optimizer thread
  double iteration_s = none;       // trainer: from the previous step()'s return to this one's
  /// Which parts reported: false where a pipeline's report never came (a failed job).
  bool complete = true;
};

/// Where records go. Called with the Metrics' lock held, one record at a time, in iteration
/// order. Must not throw: a sink that throws is dropped (Metrics::failure says why).
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const IterationMetrics& m) = 0;
  /// The run ended (the keeper stopped, or the Metrics is destroyed): flush and close.
  virtual void close() {}
  /// Why the sink writes no more, or "" while it writes.
  virtual std::string failure() const { return {}; }
};

class MetricsOptions {
  /// A record waits for its pipeline reports until a report of an iteration this many later
  /// has come; then it goes out incomplete (complete = false), so a failed step loses nothing
  /// else. >= 1.
  AMPACTOR_ARG(std::int64_t, max_pending, 8);
};

/// The join of the keeper's and the pipeline's reports; give it to KeeperOptions::tap (with
/// tee_taps beside a trace) and AsyncOptimizerOptions::tap.
class Metrics final : public KeeperTap, public PipelineTap {
 public:
  explicit Metrics(MetricsOptions options = {});
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// Adds a sink (null: ScalerError(errc::bad_option)). Chainable.
  Metrics& sink(std::shared_ptr<MetricsSink> s);
  /// Writes what is pending and closes the sinks (the keeper's stop does it too). Idempotent;
  /// reports after it are dropped.
  void close();
  /// Records written so far.
  std::int64_t written() const;
  /// The first sink's failure, or "" (GradScaler::tap_failure says it too).
  std::string failure() const override;

  // KeeperTap (the keeper's thread)
  void started(const GradScalerOptions& opts, ScalePolicy policy) override;
  void input(peer_id from, const KeeperInput& in) override;
  void output(const KeeperOutput& out) override;
  void stopped() override { close(); }
  // PipelineTap (the trainer's and the optimizer's threads)
  void attached() override;
  void detached() override;
  void trainer_step(std::int64_t k, double held_s, double iteration_s) override;
  void optimizer_step(std::int64_t k, double step_s, double grad_norm) override;

 private:
  struct State;  // the sinks, the pending records and their lock: in metrics.cpp
  std::unique_ptr<State> s_;
};

/// A line per record to a file, flushed at every record, so a killed run keeps every written
/// iteration; a failed write is kept (failure()) and nothing more is written. The two below.
class LineFileMetrics : public MetricsSink {
 public:
  ~LineFileMetrics() override;
  void write(const IterationMetrics& m) override;
  void close() override;
  std::string failure() const override;

 protected:
  /// ScalerError(errc::bad_option), naming `what`, if the file cannot be created.
  LineFileMetrics(const std::string& path, const char* what,
                  std::string (*line)(const IterationMetrics&), const std::string& header = "");

 private:
  struct File;
  std::unique_ptr<File> f_;
  std::string (*line_)(const IterationMetrics&);
};

/// JSON Lines, one object per iteration (names as IterationMetrics'; NaN is null).
class JsonlMetrics final : public LineFileMetrics {
 public:
  explicit JsonlMetrics(const std::string& path);
};

/// CSV with a header row (RFC 4180 quoting; lists joined by spaces; NaN is empty).
class CsvMetrics final : public LineFileMetrics {
 public:
  explicit CsvMetrics(const std::string& path);
};

/// Keeps the records in memory (tests, a service's own endpoint).
class MemoryMetrics final : public MetricsSink {
 public:
  void write(const IterationMetrics& m) override { records.push_back(m); }
  std::vector<IterationMetrics> records;
};

/// The line JsonlMetrics writes for m (no newline).
std::string to_json_line(const IterationMetrics& m);
/// CsvMetrics's header row and the row for m (no newline).
std::string csv_header();
std::string to_csv_row(const IterationMetrics& m);

}  // namespace ampactor
