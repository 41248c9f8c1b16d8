// Includes and helpers shared by the scale_keeper tests.
// The scale_keeper under CAF's deterministic scheduler: every message is delivered when the test
// says so, so each ordering is exercised on purpose.
#pragma once
#include "doctest_torch.h"

#include <deque>
#include <optional>
#include <random>

#include "caf_fixture.h"
#include "scale_options.h"

using namespace ampactor;
using ampactor::test::Fixture;
using ampactor::test::opts;
