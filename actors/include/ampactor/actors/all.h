// ampactor::actors, whole. The actors: the scale keeper, the optimizer actor, GradScaler.
// AsyncOptimizer is ampactor::pipeline's (<ampactor/pipeline/all.h>).
#pragma once

#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/actors/scale_keeper.h>
