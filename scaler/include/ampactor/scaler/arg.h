// Deprecated: <ampactor/scaler/arg.h> goes in the next release; include <ampactor/core/arg.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/scaler/arg.h> is deprecated: include <ampactor/core/arg.h>"
#endif
#include <ampactor/core/arg.h>
