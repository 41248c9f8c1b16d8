#pragma once

namespace caf {
class actor_system_config;
}

namespace ampactor {
/// Registers every ampactor message type and the ampactor error category with a CAF config.
/// Call it once on the config of any actor_system that hosts ampactor actors.
void register_messages(caf::actor_system_config& cfg);
}  // namespace ampactor
