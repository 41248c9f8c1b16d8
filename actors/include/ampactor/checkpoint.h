// Deprecated: <ampactor/checkpoint.h> goes in the next release; include
// <ampactor/actors/checkpoint.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/checkpoint.h> is deprecated: include <ampactor/actors/checkpoint.h>"
#endif
#include <ampactor/actors/checkpoint.h>
