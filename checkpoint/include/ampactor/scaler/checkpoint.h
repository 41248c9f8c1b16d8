// Deprecated: <ampactor/scaler/checkpoint.h> goes in the next release; include
// <ampactor/checkpoint/checkpoint.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/scaler/checkpoint.h> is deprecated: include <ampactor/checkpoint/checkpoint.h>"
#endif
#include <ampactor/checkpoint/checkpoint.h>
