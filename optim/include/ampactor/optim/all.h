// ampactor::optim, whole. The fused optimizers (FusedAdam, FusedAdamW, FusedSGD).
#pragma once

#include <ampactor/optim/fused.h>
