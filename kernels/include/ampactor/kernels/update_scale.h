// The dynamic loss-scale update on tensors, for a scale that lives on the device with the model.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ampactor::kernels {

/// torch's _amp_update_scale_ on 1-element tensors, in place: `scale` (Float) and
/// `growth_tracker` (Int) are updated from `found_inf` (Float; any non-zero value is a found
/// inf/NaN) with ampactor::apply_scale_rule (products in double rounded to float once, growth
/// when the tracker reaches `growth_interval` exactly, never to a non-finite scale).
///
/// All three on one device. On a CUDA device a one-thread kernel runs on the current stream, so
/// the host never waits for found_inf. Bad input changes nothing and throws ampactor::ScalerError,
/// the same on CPU and CUDA: errc::invalid_gradients for the tensors (shapes, dtypes, devices),
/// errc::bad_growth_interval for growth_interval < 1. A failure of the CUDA runtime itself (a
/// launch error) throws std::runtime_error.
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, std::int64_t growth_interval);

}  // namespace ampactor::kernels
