// Include this instead of <doctest/doctest.h> in tests that use torch headers. Debian's LibTorch
// is built with glog, whose logging.h defines CHECK (abort on failure, not counted as a test
// assertion). Pull glog in first, drop its macros, then let doctest define its own.
#pragma once

#include <c10/util/Logging.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_NOTNULL

#include <doctest/doctest.h>

#include "skip.h"
