// ampactor::scaler, whole. The thread-free scaler: LocalGradScaler and the step tracker.
#pragma once

#include <ampactor/scaler/clip.h>
#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/scaler/overflow.h>
#include <ampactor/scaler/ranks.h>
#include <ampactor/scaler/step_tracker.h>
