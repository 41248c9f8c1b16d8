// Deprecated: <ampactor/scaler/errors.h> goes in the next release; include
// <ampactor/core/errors.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/scaler/errors.h> is deprecated: include <ampactor/core/errors.h>"
#endif
#include <ampactor/core/errors.h>
