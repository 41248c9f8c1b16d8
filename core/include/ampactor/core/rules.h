// apply_scale_rule: torch's update rule and the peers', one function each, written from its
// published source (file and commit cited at each). Included by update_rule.h; host and device
// code.
//
// The scale is a float everywhere, as torch keeps it. Where a peer keeps it as a Python double
// (deepspeed, apex) the trajectories are equal bit for bit while every scale is a normal float,
// which their factor of 2 ensures from a float init_scale (and min_scale). Where a peer's growth
// would leave float's range (megatron, colossalai, keras and deepspeed/apex beyond 2^127 check
// nothing), the growth is refused, as torch refuses it: a scale of inf would turn every later step
// into an overflow.
#pragma once

namespace ampactor {
namespace detail {

AMPACTOR_HOST_DEVICE inline float f32(double x) {
  return static_cast<float>(x);
}
AMPACTOR_HOST_DEVICE inline float fmax32(float a, float b) {
  return a < b ? b : a;
}
AMPACTOR_HOST_DEVICE inline double fmax64(double a, double b) {
  return a < b ? b : a;
}

/// A grown scale is taken only when finite (see above); the tracker restarts either way.
AMPACTOR_HOST_DEVICE inline void take_growth(ScaleRuleState& state, float grown,
                                             UpdateOutcome& out) {
  if (finite(grown)) {
    state.scale = grown;
    out.grew = true;
  } else {
    out.growth_refused = true;
  }
  state.growth_tracker = 0;
}

/// The clean-step count every rule but deepspeed shares: the N-th clean step since the last
/// overflow or growth grows (`==`: an interval lowered below the tracker stalls growth until the
/// next backoff, as in torch; tf's `>=` grows at once). Saturates at INT32_MAX where an int32
/// `+ 1` would overflow.
AMPACTOR_HOST_DEVICE inline bool count_clean_step(const ScaleRule& rule, ScaleRuleState& state) {
  const std::int64_t successful = std::int64_t(state.growth_tracker) + 1;
  const bool due = rule.kind == RuleKind::tf ? successful >= rule.growth_interval
                                             : successful == rule.growth_interval;
  if (!due && successful <= INT32_MAX) state.growth_tracker = static_cast<std::int32_t>(successful);
  return due;
}

/// pytorch aten/src/ATen/native/cuda/AmpKernels.cu (_amp_update_scale_cuda_kernel): products in
/// double, rounded to float once. min_scale and max_scale are ampactor's (off by default).
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_torch_rule(const ScaleRule& rule,
                                                           ScaleRuleState& state, bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  const bool has_min = rule.min_scale > 0, has_max = rule.max_scale < INFINITY;
  if (found_inf) {
    float b = f32(double(s) * rule.backoff_factor);
    if (has_min) b = fmax32(b, f32(rule.min_scale));
    state.scale = b;
    state.growth_tracker = 0;
    out.backed_off = true;
  } else if (count_clean_step(rule, state)) {
    float g = f32(double(s) * rule.growth_factor);
    if (has_max && g > f32(rule.max_scale)) g = f32(rule.max_scale);
    take_growth(state, g, out);
  }
  return out;
}

/// deepspeedai/DeepSpeed deepspeed/runtime/fp16/loss_scaler.py as released in deepspeed 0.19.8,
/// DynamicLossScaler.update_scale L253-L288 (ZeRO's scaler; tests/fixtures/deepspeed holds the
/// package's own trajectories). The hysteresis (delayed_shift) absorbs overflows; a backoff does
/// not refill it. A clean step grows when stable_interval = cur_iter - last_overflow_iter - 1 (the
/// clean steps before it since the last overflow) is > 0 and a multiple of scale_window: the
/// (w+1)-th clean step, then every w-th. growth_tracker is that count modulo w, kept in [1, w] once
/// there is one (0: none), so it stays bounded and a growth does not restart it; a loaded tracker
/// t reads as stable_interval t (peer_state_dict.cpp converts both ways).
/// Bit for bit while DeepSpeed's double is a normal float (factor 2, float init_scale and
/// min_scale); another factor, or a subnormal scale, rounds to float where DeepSpeed's double
/// stays exact. The floor and the raise test compare in float, the scale's type (min_scale 0.3
/// raises at float(0.3) as DeepSpeed raises at 0.3), and never below smallest_scale(): there the
/// rule raises or stays as at min_scale, where DeepSpeed's double would go on halving.
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_deepspeed_rule(const ScaleRule& rule,
                                                               ScaleRuleState& state,
                                                               bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  if (found_inf) {
    if (rule.hysteresis == 1 || state.hysteresis_tracker == 1) {
      const float floor = fmax32(f32(rule.min_scale), smallest_scale());
      if (rule.raise_at_min_scale && s == floor) {
        out.at_min_scale = true;  // deepspeed raises before changing anything
        return out;
      }
      state.scale = fmax32(f32(double(s) / rule.growth_factor), floor);
      out.backed_off = true;
    } else {
      state.hysteresis_tracker -= 1;
      out.absorbed = true;
    }
    state.growth_tracker = 0;  // last_overflow_iter = cur_iter
    return out;
  }
  if (rule.consecutive_hysteresis) state.hysteresis_tracker = rule.hysteresis;
  const std::int64_t stable = state.growth_tracker, window = rule.growth_interval;
  state.growth_tracker = static_cast<std::int32_t>(1 + stable % window);
  if (stable > 0 && stable % window == 0) {
    if (!rule.consecutive_hysteresis) state.hysteresis_tracker = rule.hysteresis;
    const float grown = f32(double(s) * rule.growth_factor);
    if (finite(grown)) {  // refused past float's range, as in take_growth
      state.scale = grown;
      out.grew = true;
    } else {
      out.growth_refused = true;
    }
  }
  return out;
}

/// NVIDIA/Megatron-LM megatron/core/optimizer/grad_scaler.py @d98e8a64, DynamicGradScaler.update;
/// hpcaitech/ColossalAI colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py @4f9953be,
/// update. Both keep a float32 tensor times float32 factors; every overflow restarts the growth
/// count, the hysteresis only refills on growth. colossalai counts its hysteresis up
/// (_hysteresis_step >= hysteresis backs off), megatron down (<= 0): the same test.
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_megatron_rule(const ScaleRule& rule,
                                                              ScaleRuleState& state,
                                                              bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  const bool has_min = rule.min_scale > 0, has_max = rule.max_scale < INFINITY;
  if (found_inf) {
    state.growth_tracker = 0;
    if (state.hysteresis_tracker > INT32_MIN) state.hysteresis_tracker -= 1;
    if (state.hysteresis_tracker <= 0) {
      float b = s * f32(rule.backoff_factor);
      if (has_min) b = fmax32(b, f32(rule.min_scale));
      state.scale = b;
      out.backed_off = true;
    } else {
      out.absorbed = true;
    }
  } else if (count_clean_step(rule, state)) {
    state.hysteresis_tracker = rule.hysteresis;
    float g = s * f32(rule.growth_factor);
    if (has_max && g > f32(rule.max_scale)) g = f32(rule.max_scale);  // colossalai only
    take_growth(state, g, out);
  }
  return out;
}

/// NVIDIA/apex apex/amp/scaler.py @e13873de (the last commit with apex.amp),
/// LossScaler.update_scale: Python doubles, factor 2 hard-coded, min only when given.
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_apex_rule(const ScaleRule& rule,
                                                          ScaleRuleState& state, bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  if (found_inf) {
    const double half = double(s) / 2.;
    state.scale = f32(rule.min_scale > 0 ? fmax64(rule.min_scale, half) : half);
    state.growth_tracker = 0;
    out.backed_off = true;
  } else if (count_clean_step(rule, state)) {
    const double twice = double(s) * 2.;
    take_growth(state, f32(twice < rule.max_scale ? twice : rule.max_scale), out);
  }
  return out;
}

/// keras-team/keras keras/src/optimizers/loss_scale_optimizer.py @3422977a: a float32 variable
/// halved on non-finite gradients and doubled on the N-th finite step; no floor.
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_keras_rule(const ScaleRule& rule,
                                                           ScaleRuleState& state, bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  if (found_inf) {
    state.scale = s * 0.5f;
    state.growth_tracker = 0;
    out.backed_off = true;
  } else if (count_clean_step(rule, state)) {
    take_growth(state, s * 2.0f, out);
  }
  return out;
}

/// tensorflow/tensorflow tensorflow/python/training/experimental/loss_scale.py @34365343
/// (DynamicLossScale; tf-keras's _DynamicLossScaleState is the same): float32, the floor fixed at
/// 1, growth when good_steps + 1 >= period and only to a finite scale.
/// google-deepmind/jmp jmp/_src/loss_scale.py @9c1cdbbf (DynamicLossScale.adjust): float32,
/// maximum(min_loss_scale, scale / factor), growth only to a finite scale. That is eager jmp:
/// under jax.jit (jmp 0.0.4) min_loss_scale is dropped (the floor becomes 1) and XLA turns the
/// division by a factor that is not a power of two into a multiply (1 ulp off).
/// Both divide by their one factor (growth_factor here).
AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_tf_rule(const ScaleRule& rule,
                                                        ScaleRuleState& state, bool found_inf) {
  UpdateOutcome out;
  const float s = state.scale;
  if (found_inf) {
    state.scale = fmax32(s / f32(rule.growth_factor), f32(rule.min_scale));
    state.growth_tracker = 0;
    out.backed_off = true;
  } else if (count_clean_step(rule, state)) {
    take_growth(state, s * f32(rule.growth_factor), out);
  }
  return out;
}

}  // namespace detail

AMPACTOR_HOST_DEVICE inline UpdateOutcome apply_scale_rule(const ScaleRule& rule,
                                                           ScaleRuleState& state, bool found_inf) {
  using namespace detail;
  switch (rule.kind) {
    case RuleKind::torch:
      return apply_torch_rule(rule, state, found_inf);
    case RuleKind::deepspeed:
      return apply_deepspeed_rule(rule, state, found_inf);
    case RuleKind::megatron:
    case RuleKind::colossalai:
      return apply_megatron_rule(rule, state, found_inf);
    case RuleKind::apex:
      return apply_apex_rule(rule, state, found_inf);
    case RuleKind::keras:
      return apply_keras_rule(rule, state, found_inf);
    case RuleKind::tf:
    case RuleKind::jmp:
      return apply_tf_rule(rule, state, found_inf);
  }
  return UpdateOutcome{};
}

}  // namespace ampactor
