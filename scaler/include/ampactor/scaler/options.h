// Deprecated: <ampactor/scaler/options.h> goes in the next release; include
// <ampactor/core/options.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/scaler/options.h> is deprecated: include <ampactor/core/options.h>"
#endif
#include <ampactor/core/options.h>
