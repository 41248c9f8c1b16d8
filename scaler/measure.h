// The step tracker's measuring helpers, shared by its files. Internal (not installed).
#pragma once

#include <ampactor/scaler/step_tracker.h>

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace ampactor::detail {

/// A 0-dim fp32 zero on `device`: a found_inf or absmax accumulator.
at::Tensor zero_on(c10::Device device);
/// Measures a list that mixes dtypes: a read-only pass per dtype, before the one call that checks
/// and writes the whole list (so a refusal still changes nothing). One dtype: nothing to do here,
/// the single call measures. Returns whether it measured.
/// `attributed`: where each call's overflow attribution goes (kernels::Measures::nonfinite;
/// Attributed::params are positions in `grads`), or null.
bool measure_mixed(const std::vector<at::Tensor>& grads, at::Tensor& found, AbsmaxList& absmax,
                   std::vector<Attributed>* attributed = nullptr);
/// unscale_and_check of `grads` into `found`, measuring them (absmax per dtype; `attributed` as
/// above).
void unscale_measured(const std::vector<at::Tensor>& grads, float inv_scale, at::Tensor& found,
                      AbsmaxList& absmax, std::vector<Attributed>* attributed = nullptr);
/// The flags of one call over `n` gradients, their positions 0..n-1.
Attributed whole_list(std::size_t n, c10::Device device);

}  // namespace ampactor::detail
