// The CAF imported targets link and a typed actor answers under the deterministic scheduler that
// the actor tests rely on.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

namespace {
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pinger = caf::typed_actor<caf::replies_to<ping_atom, int>::with<int>>;

pinger::behavior_type doubling() {
  return {[](ping_atom, int x) { return 2 * x; }};
}
}  // namespace

TEST_CASE("CAF 0.17 test_coordinator drives a typed actor one message at a time") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto actor = sys.spawn(doubling);
  sched.run();
  int got = 0;
  {
    caf::scoped_actor self{sys};
    self->send(actor, ping_atom::value, 21);
    CHECK(self->mailbox().empty());  // nothing runs until the coordinator says so
    CHECK(sched.try_run_once());
    self->receive([&](int r) { got = r; });
  }
  CHECK(got == 42);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  sched.run();
}
