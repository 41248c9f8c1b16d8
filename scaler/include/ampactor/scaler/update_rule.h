// Deprecated: <ampactor/scaler/update_rule.h> goes in the next release; include
// <ampactor/core/update_rule.h>.
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/scaler/update_rule.h> is deprecated: include <ampactor/core/update_rule.h>"
#endif
#include <ampactor/core/update_rule.h>
