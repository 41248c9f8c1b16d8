// Deprecated: <ampactor/scaler/stage.h> goes in the next release; include <ampactor/core/stage.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/scaler/stage.h> is deprecated: include <ampactor/core/stage.h>"
#endif
#include <ampactor/core/stage.h>
