// The one CAF configuration for systems that host ampactor actors: the messages and the error
// category registered. The GradScaler's own system, the benches, the tests and the tools use it.
#pragma once

#include <caf/actor_system_config.hpp>

#include <cstddef>

namespace ampactor {

class SystemConfig : public caf::actor_system_config {
 public:
  SystemConfig();
  /// The scheduler's worker threads (CAF's default: one per core). The keeper and the optimizer
  /// have threads of their own when detached, so a system that hosts only them needs few.
  SystemConfig& scheduler_threads(std::size_t n);
};

}  // namespace ampactor
