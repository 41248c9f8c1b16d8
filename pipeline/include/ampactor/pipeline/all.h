// ampactor::pipeline, whole. The asynchronous optimizer pipeline (AsyncOptimizer) with its GPU
// offload, overlapped backward and sharded optimizer state, and its checkpoints.
#pragma once

#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/pipeline/checkpoint.h>
