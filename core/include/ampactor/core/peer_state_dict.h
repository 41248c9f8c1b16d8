// A scaler's state_dict in the peers' key layouts, both ways, so that a run started in DeepSpeed,
// Megatron-LM, Apex, Colossal-AI, Keras, TensorFlow or jmp continues in ampactor with the same
// trajectory, and back. Conversions between dicts: they work for LocalGradScaler and GradScaler
// alike (scaler.load_state_dict(from_peer_state_dict(...))).
//
// The layouts (values as Python numbers; the peers' own names):
//   deepspeed:  cur_scale, cur_iter, last_overflow_iter, scale_factor, scale_window, min_scale,
//               delayed_shift, cur_hysteresis (DynamicLossScaler's attributes)
//   megatron:   scale, growth_tracker, hysteresis_tracker
//   apex:       loss_scale, unskipped (amp.state_dict()'s "loss_scaler0")
//   colossalai: scale, growth_factor, backoff_factor, hysteresis
//   keras:      dynamic_scale, step_counter
//   tf:         current_loss_scale, good_steps
//   jmp:        loss_scale, counter
//   torch:      torch's own (state_dict() as it is)
// Megatron and Colossal-AI keep `scale` as a 1-element float32 tensor: pass scale.item() in, and
// wrap what comes out (torch.tensor([v])) before their load_state_dict.
#pragma once

#include <ampactor/core/options.h>
#include <ampactor/core/state_dict.h>

namespace ampactor {

/// `ours` (a state_dict() of a scaler built with `opts`) in `layout`'s keys. deepspeed's cur_iter
/// and last_overflow_iter are given as the clean steps since the last overflow (modulo the
/// window, which is all its growth test reads) and -1: DeepSpeed uses only their difference. An
/// empty dict (a disabled scaler) stays empty.
StateDict to_peer_state_dict(const StateDict& ours, const GradScalerOptions& opts, RuleKind layout);

/// A peer's state_dict in `layout`'s keys as ampactor's, for load_state_dict of a scaler built
/// with `opts`. Throws ScalerError(bad_state_dict) naming the key for a missing key, a value of
/// the wrong type or out of range, and for a setting the dict holds that `opts` do not share
/// (e.g. deepspeed's min_scale or delayed_shift): build the scaler with the peer's settings.
/// Colossal-AI does not save its step counters; like Colossal-AI on a resume, they restart.
StateDict from_peer_state_dict(const StateDict& theirs, const GradScalerOptions& opts,
                               RuleKind layout);

}  // namespace ampactor
