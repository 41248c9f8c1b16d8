// Deprecated: <ampactor/actors/async_optimizer.h> goes in the next release; include
// <ampactor/pipeline/async_optimizer.h> (ampactor::pipeline).
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/actors/async_optimizer.h> is deprecated: include <ampactor/pipeline/async_optimizer.h>"
#endif
#include <ampactor/pipeline/async_optimizer.h>
