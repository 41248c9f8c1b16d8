// A deterministic actor test bed: CAF's test_coordinator delivers every message only when the test
// runs the scheduler, and a scoped actor stands for the trainer and reads replies without blocking.
#pragma once

#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/actors/scale_keeper.h>
#include <ampactor/messages/config.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <optional>

namespace ampactor::test {

/// ampactor's config with CAF's deterministic scheduler (tests only).
struct Config : SystemConfig {
  Config() { set("scheduler.policy", caf::atom("testing")); }
};

struct Fixture {
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys};
  scale_keeper_actor keeper;
  caf::error last_error;

  explicit Fixture(GradScalerOptions opts = {}, ScalePolicy policy = ScalePolicy::exact) {
    keeper = spawn_scale_keeper(sys, opts, KeeperOptions().policy(policy).detached(false));
    sched.run();
  }
  ~Fixture() {
    caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Sends to the keeper and runs every job that follows from it.
  template <class... Ts>
  void send(Ts... msg) {
    send_to(keeper, std::move(msg)...);
  }
  template <class Handle, class... Ts>
  void send_to(const Handle& to, Ts... msg) {
    self->send(to, std::move(msg)...);
    sched.run();
  }

  /// The next message in the trainer's mailbox, if it is a T (an error is kept in last_error).
  template <class T>
  std::optional<T> take() {
    std::optional<T> out;
    if (self->mailbox().empty()) return out;
    self->receive([&](const T& x) { out = x; }, [&](caf::error& e) { last_error = e; },
                  caf::others >> [](caf::message_view&) -> caf::result<caf::message> {
                    return caf::sec::unexpected_message;
                  });
    return out;
  }
  bool idle() { return self->mailbox().empty(); }
};

}  // namespace ampactor::test
