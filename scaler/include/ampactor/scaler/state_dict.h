// Deprecated: <ampactor/scaler/state_dict.h> goes in the next release; include
// <ampactor/core/state_dict.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/scaler/state_dict.h> is deprecated: include <ampactor/core/state_dict.h>"
#endif
#include <ampactor/core/state_dict.h>
