// The peers' update rules transcribed line by line from their published Python (file and commit
// or release as cited in core/include/ampactor/core/rules.h), in the peer's own terms, state and
// number types: the plain references that ampactor's data-driven rules must equal bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace ampactor::test::peer {

/// deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler (Python doubles and ints), as in
/// deepspeed 0.19.8: update_scale L253-L288 (the logging left out). The fixtures from the real
/// package (test_deepspeed_fixtures.cpp) check this transcription.
struct DeepSpeed {
  double cur_scale;
  double scale_factor = 2.0;
  std::int64_t scale_window = 1000;
  double min_scale = 1;
  std::int64_t delayed_shift = 1;
  bool consecutive_hysteresis = false;
  bool raise_error_at_min_scale = true;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = delayed_shift;

  static std::int64_t py_mod(std::int64_t a, std::int64_t b) { return ((a % b) + b) % b; }

  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale && raise_error_at_min_scale)
          throw std::runtime_error(
              "Current loss scale already at minimum - cannot decrease scale anymore. Exiting "
              "run.");
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      const std::int64_t stable_interval = (cur_iter - last_overflow_iter) - 1;
      if (stable_interval > 0 && py_mod(stable_interval, scale_window) == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
};

/// megatron/core/optimizer/grad_scaler.py, DynamicGradScaler (float32 tensors).
struct Megatron {
  float scale;
  float min_scale = 1.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 1000;
  std::int64_t hysteresis = 2;
  std::int64_t growth_tracker = 0;
  std::int64_t hysteresis_tracker = hysteresis;

  void update(bool found_inf) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) scale = std::max(scale * backoff_factor, min_scale);
    } else {
      growth_tracker += 1;
      if (growth_tracker == growth_interval) {
        growth_tracker = 0;
        hysteresis_tracker = hysteresis;
        scale = scale * growth_factor;
      }
    }
  }
};

/// apex/amp/scaler.py, LossScaler.update_scale (Python doubles; min None when 0).
struct Apex {
  double loss_scale = 65536.0;
  std::int64_t scale_seq_len = 2000;
  double min_loss_scale = 0;
  double max_loss_scale = 16777216.0;
  std::int64_t unskipped = 0;

  void update_scale(bool has_overflow) {
    if (has_overflow) {
      if (min_loss_scale)
        loss_scale = std::max(min_loss_scale, loss_scale / 2.);
      else
        loss_scale = loss_scale / 2.;
      unskipped = 0;
    } else {
      unskipped += 1;
    }
    if (unskipped == scale_seq_len) {
      loss_scale = std::min(max_loss_scale, loss_scale * 2.);
      unskipped = 0;
    }
  }
};

/// colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py (float32 tensor, Python factors
/// used at float32; min and max None when 0 / inf).
struct ColossalAI {
  float scale = 65536.0f;
  double growth_factor = 2, backoff_factor = 0.5;
  std::int64_t growth_interval = 1000;
  float min_scale = 0, max_scale = INFINITY;
  std::int64_t hysteresis = 2;
  std::int64_t growth_step = 0, hysteresis_step = 0;

  void update(bool overflow) {
    if (overflow) {
      hysteresis_step += 1;
      growth_step = 0;
      if (hysteresis_step >= hysteresis) {
        scale = scale * float(backoff_factor);
        if (min_scale) scale = std::max(scale, min_scale);
      }
    } else {
      growth_step += 1;
      if (growth_step == growth_interval) {
        growth_step = 0;
        hysteresis_step = 0;
        scale = scale * float(growth_factor);
        if (max_scale < INFINITY) scale = std::min(scale, max_scale);
      }
    }
  }
};

/// keras/src/optimizers/loss_scale_optimizer.py (float32 variable, int counter).
struct Keras {
  float dynamic_scale = 32768.0f;
  std::int64_t dynamic_growth_steps = 2000;
  std::int64_t step_counter = 0;

  void apply(bool finite) {
    if (finite) {
      if (step_counter == dynamic_growth_steps - 1) {
        step_counter = 0;
        dynamic_scale = dynamic_scale * 2.0f;
      } else {
        step_counter += 1;
      }
    } else {
      step_counter = 0;
      dynamic_scale = dynamic_scale * 0.5f;
    }
  }
};

/// tensorflow/python/training/experimental/loss_scale.py, DynamicLossScale (float32, int64).
struct TF {
  float current_loss_scale = 32768.0f;
  std::int64_t increment_period = 2000;
  float multiplier = 2.0f;
  std::int64_t num_good_steps = 0;

  void update(bool is_finite) {
    if (is_finite) {
      if (num_good_steps + 1 >= increment_period) {
        const float new_loss_scale = current_loss_scale * multiplier;
        if (std::isfinite(new_loss_scale))
          current_loss_scale = new_loss_scale;  // _assign_if_finite
        num_good_steps = 0;
      } else {
        num_good_steps += 1;
      }
    } else {
      num_good_steps = 0;
      current_loss_scale = std::max(current_loss_scale / multiplier, 1.0f);
    }
  }
};

/// jmp/_src/loss_scale.py, DynamicLossScale.adjust (float32, int32 counter).
struct Jmp {
  float loss_scale = 32768.0f;
  std::int32_t counter = 0;
  std::int32_t period = 2000;
  float factor = 2.0f;
  float min_loss_scale = 1.0f;

  void adjust(bool grads_finite) {
    auto first_finite = [](float a, float b) { return std::isfinite(a) ? a : b; };
    const float grown =
        counter == period - 1 ? first_finite(loss_scale * factor, loss_scale) : loss_scale;
    loss_scale = grads_finite ? grown : std::max(min_loss_scale, loss_scale / factor);
    counter = ((counter + 1) % period) * std::int32_t(grads_finite);
  }
};

}  // namespace ampactor::test::peer
