// ampactor::actors, whole. The actors: the scale keeper, the optimizer actor, GradScaler,
// AsyncOptimizer.
#pragma once

#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/actors/scale_keeper.h>
