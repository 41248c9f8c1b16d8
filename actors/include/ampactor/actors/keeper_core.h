// Deprecated: <ampactor/actors/keeper_core.h> goes in the next release; include
// <ampactor/keeper/keeper_core.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/actors/keeper_core.h> is deprecated: include <ampactor/keeper/keeper_core.h>"
#endif
#include <ampactor/keeper/keeper_core.h>
