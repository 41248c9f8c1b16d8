// Ranks at the edges: a rank missing at start-up is named, a hung rank is told apart from a dead
// one, a rank resumed after the others failed exits with their reason.
#include "dist_fixture.h"

using namespace ampactor::test::dist;
