// ampactor::keeper, whole. The keeper's protocol as plain values and the keeper core (no CAF, no
// torch).
#pragma once

#include <ampactor/keeper/keeper_core.h>
#include <ampactor/keeper/protocol.h>
#include <ampactor/keeper/taps.h>
