// Deprecated: <ampactor/scaler/rules.h> goes in the next release; include <ampactor/core/rules.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/scaler/rules.h> is deprecated: include <ampactor/core/rules.h>"
#endif
#include <ampactor/core/rules.h>
