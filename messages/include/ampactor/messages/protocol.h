// Deprecated: <ampactor/messages/protocol.h> goes in the next release; include
// <ampactor/keeper/protocol.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/messages/protocol.h> is deprecated: include <ampactor/keeper/protocol.h>"
#endif
#include <ampactor/keeper/protocol.h>
