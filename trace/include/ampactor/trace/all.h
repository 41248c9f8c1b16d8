// ampactor::trace, whole. Traces: recording, reading, replay and what-if (no CAF).
#pragma once

#include <ampactor/trace/replay.h>
#include <ampactor/trace/rig.h>
#include <ampactor/trace/trace.h>
