// What the peer-sequence tests share: the step rows, their driver, and the peers' sources the
// rows' comments cite (test_peer_sequences.cpp: each rule alone; test_peer_sequences_switched.cpp:
// rules switched through load_state_dict).
// Each rule through a short hand-written sequence of overflow (O) and clean (C) steps, with the
// scale, the growth tracker, the hysteresis tracker (where the rule has one) and the errors
// checked after every step. Every expected value is derived by hand from the peer's published
// source (not from tests/peer_reference.h); the comment beside each row cites the lines it
// follows from. Sources (file @ commit):
//   [DS]  deepspeedai/DeepSpeed deepspeed/runtime/fp16/loss_scaler.py as released in deepspeed
//         0.19.8, DynamicLossScaler: init L228-L234, update_scale L253-L288
//   [MEG] NVIDIA/Megatron-LM megatron/core/optimizer/grad_scaler.py @d98e8a64ddf3,
//         DynamicGradScaler: init L127-L129, update L131-L153
//   [APX] NVIDIA/apex apex/amp/scaler.py @e13873debc46, LossScaler.update_scale L197-L217
//   [CAI] hpcaitech/ColossalAI colossalai/amp/naive_amp/grad_scaler/dynamic_grad_scaler.py
//         @4f9953be335e: init L60-L62, update L78-L101, _backoff_scale L103-L108,
//         _grow_scale L110-L115
//   [KRS] keras-team/keras keras/src/optimizers/loss_scale_optimizer.py @3422977a5e38:
//         finite L225-L237, non-finite L239-L242
//   [TF]  tensorflow/tensorflow tensorflow/python/training/experimental/loss_scale.py
//         @34365343b047, DynamicLossScale: init L348-L355, update L393-L414
//   [JMP] google-deepmind/jmp jmp/_src/loss_scale.py @9c1cdbbf78da, DynamicLossScale.adjust
//         L149-L174
//   [PT]  pytorch/pytorch aten/src/ATen/native/cuda/AmpKernels.cu @5bde21621b28,
//         amp_update_scale_cuda_kernel L187-L200 (min_scale and max_scale are ampactor's own:
//         doc/guide/update-rules.md, the torch row)
// The growth tracker is each peer's count of clean steps since the last overflow or growth:
// DeepSpeed's since the last overflow only (after the step, cur_iter - last_overflow_iter - 1),
// kept modulo scale_window in [1, scale_window] once there is one; Megatron's _growth_tracker,
// apex's _unskipped, Colossal-AI's _growth_step, keras's step_counter, tf's num_good_steps, jmp's
// counter. The hysteresis tracker: DeepSpeed's cur_hysteresis, Megatron's _hysteresis_tracker,
// Colossal-AI's hysteresis - _hysteresis_step.
#pragma once

#include "doctest_torch.h"

#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "refusal.h"

using ampactor::errc;
using ampactor::GradScalerOptions;
using ampactor::ScaleState;
using ampactor::test::refusal_of;

namespace {

constexpr bool O = true;   // an overflow
constexpr bool C = false;  // a clean step

/// One step and what must hold after it.
struct Row {
  bool inf;
  double scale;
  std::int64_t growth;
  std::optional<std::int64_t> hysteresis = std::nullopt;  // rules with hysteresis only
  errc error = errc{};  // the step is refused with this code, and nothing changes
};

template <std::size_t N>
void drive(ScaleState& s, const Row (&rows)[N]) {
  for (std::size_t i = 0; i < N; ++i) {
    const Row& r = rows[i];
    CAPTURE(i);
    CAPTURE(r.inf);
    const float scale_before = s.scale();
    const std::int64_t growth_before = s.growth_tracker();
    const std::int64_t hysteresis_before = s.hysteresis_tracker();
    CHECK(refusal_of([&] { s.update(r.inf); }).code == r.error);
    if (r.error != errc{}) {  // nothing changed
      CHECK(s.scale() == scale_before);
      CHECK(s.growth_tracker() == growth_before);
      CHECK(s.hysteresis_tracker() == hysteresis_before);
    }
    CHECK(double(s.scale()) == r.scale);
    CHECK(s.growth_tracker() == r.growth);
    if (r.hysteresis) CHECK(s.hysteresis_tracker() == *r.hysteresis);
  }
}

ScaleState started(const GradScalerOptions& o) {
  REQUIRE_NOTHROW(o.validate());
  ScaleState s(o);
  s.lazy_init();
  return s;
}

}  // namespace
