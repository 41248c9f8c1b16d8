// Deprecated: <ampactor/actors/sharded_checkpoint.h> goes in the next release; include
// <ampactor/checkpoint/sharded_checkpoint.h> (ampactor::checkpoint: no actors, no CAF).
#pragma once

#if defined(__GNUC__) && !defined(AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS)
#pragma GCC warning \
    "<ampactor/actors/sharded_checkpoint.h> is deprecated: include <ampactor/checkpoint/sharded_checkpoint.h>"
#endif
#include <ampactor/checkpoint/sharded_checkpoint.h>
