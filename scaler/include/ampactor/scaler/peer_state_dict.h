// Deprecated: <ampactor/scaler/peer_state_dict.h> goes in the next release; include
// <ampactor/core/peer_state_dict.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/scaler/peer_state_dict.h> is deprecated: include <ampactor/core/peer_state_dict.h>"
#endif
#include <ampactor/core/peer_state_dict.h>
