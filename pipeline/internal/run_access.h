// What save_run and load_run (the run library, above this one) read and change of a pipeline's
// privates: its checked load, its shard's ranks and layout, its parameters' shapes. Defined in
// checkpoint.cpp; not installed.
#pragma once

#include <ampactor/pipeline/async_optimizer.h>
#include "pipeline.h"

#include <cstdint>
#include <vector>

namespace ampactor {
class RankGroup;
class ShardLayout;
}  // namespace ampactor

namespace ampactor::internal {

/// What save_run and load_run need of a pipeline's privates.
struct RunAccess {
  using Loaded = Pipeline::Loaded;
  static Loaded checked_load(const AsyncOptimizer& pipe, torch::serialize::InputArchive& archive) {
    return pipe.p_->checked_load(archive);
  }
  static void apply_load(AsyncOptimizer& pipe, const Loaded& l) { pipe.p_->apply_load(l); }
  static bool sharded(const AsyncOptimizer& pipe);
  static RankGroup& ranks(const AsyncOptimizer& pipe);
  static const ShardLayout& layout(const AsyncOptimizer& pipe);
  /// The model parameters' shapes, in the layout's order.
  static std::vector<std::vector<std::int64_t>> shapes(const AsyncOptimizer& pipe);
  static ShardReplicas replicas(const AsyncOptimizer& pipe) {
    return pipe.p_->options.shard_replicas();
  }
};

}  // namespace ampactor::internal
