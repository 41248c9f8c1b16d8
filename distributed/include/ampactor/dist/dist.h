// Deprecated: <ampactor/dist/dist.h> goes in the next release; include
// <ampactor/distributed/dist.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning "<ampactor/dist/dist.h> is deprecated: include <ampactor/distributed/dist.h>"
#endif
#include <ampactor/distributed/dist.h>
