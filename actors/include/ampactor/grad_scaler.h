// Deprecated: <ampactor/grad_scaler.h> goes in the next release; include
// <ampactor/actors/grad_scaler.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/grad_scaler.h> is deprecated: include <ampactor/actors/grad_scaler.h>"
#endif
#include <ampactor/actors/grad_scaler.h>
