// Deprecated: <ampactor/scaler/scale_state.h> goes in the next release; include
// <ampactor/core/scale_state.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/scaler/scale_state.h> is deprecated: include <ampactor/core/scale_state.h>"
#endif
#include <ampactor/core/scale_state.h>
