// ampactor::core, whole. The bottom layer: errors, options, the scale state and its rules,
// state_dict (no torch, no CAF).
#pragma once

#include <ampactor/core/arg.h>
#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/core/overflow.h>
#include <ampactor/core/peer_state_dict.h>
#include <ampactor/core/rules.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/stage.h>
#include <ampactor/core/state_dict.h>
#include <ampactor/core/update_rule.h>
