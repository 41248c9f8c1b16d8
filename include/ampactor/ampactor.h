// Everything ampactor::ampactor links: the thread-free and actor-backed scalers, the pipeline, the
// fused optimizers, checkpoints and traces. Data parallel has its own header and target:
// <ampactor/distributed/all.h>, ampactor::distributed.
#pragma once

#include <ampactor/actors/all.h>
#include <ampactor/checkpoint/all.h>
#include <ampactor/core/all.h>
#include <ampactor/keeper/all.h>
#include <ampactor/kernels/all.h>
#include <ampactor/messages/all.h>
#include <ampactor/optim/all.h>
#include <ampactor/pipeline/all.h>
#include <ampactor/run/all.h>
#include <ampactor/scaler/all.h>
#include <ampactor/trace/all.h>
#include <ampactor/version.h>
