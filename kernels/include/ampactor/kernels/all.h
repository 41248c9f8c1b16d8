// ampactor::kernels, whole. The unscale/check, grad-move, scale-update and fused-step kernels.
#pragma once

#include <ampactor/kernels/fused_step.h>
#include <ampactor/kernels/unscale.h>
#include <ampactor/kernels/update_scale.h>
