// A metrics sink that writes TensorBoard event files: `tensorboard --logdir DIR` shows each
// figure as a scalar over the iterations. Tags: Megatron-LM's and DeepSpeed's names where they
// log the same figure (loss-scale, grad-norm, iteration-time, Train/Samples/elapsed_time_ms_step),
// ampactor/... for the rest (doc/guide/metrics.md). Built where protobuf is (Debian's
// libprotobuf-dev, protobuf-compiler): ampactor::metrics_tensorboard.
#pragma once

#include <memory>
#include <string>

#include <ampactor/metrics/metrics.h>

namespace ampactor {

class TensorBoardMetrics final : public MetricsSink {
 public:
  /// Creates `dir` (and its parents) and a new event file in it, named as TensorBoard's writers
  /// name theirs (events.out.tfevents.<time>.<host>.<pid>.ampactor). ScalerError(errc::bad_option)
  /// if it cannot.
  explicit TensorBoardMetrics(const std::string& dir);
  ~TensorBoardMetrics() override;
  /// One event per iteration (step = k), every record flushed.
  void write(const IterationMetrics& m) override;
  void close() override;
  std::string failure() const override;
  /// The event file's path.
  const std::string& path() const;

 private:
  struct File;
  std::unique_ptr<File> f_;
};

/// A TensorBoard record's checksum: CRC-32C (Castagnoli), masked as TFRecord masks it.
std::uint32_t tfrecord_masked_crc(const void* data, std::size_t n);

}  // namespace ampactor
