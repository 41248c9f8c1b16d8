// ampactor-launch owning its ranks: they die with it, signals are forwarded and followed by
// SIGKILL after a grace period, and its exit status says what happened to each rank.
#include "dist_fixture.h"

using namespace ampactor::test::dist;
