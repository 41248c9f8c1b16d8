// The step tracker's measuring helpers, shared by its files. Internal (not installed).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace ampactor::detail {

/// A 0-dim fp32 zero on `device`: a found_inf or absmax accumulator.
at::Tensor zero_on(c10::Device device);
/// Measures a list that mixes dtypes: a read-only pass per dtype, before the one call that checks
/// and writes the whole list (so a refusal still changes nothing). One dtype: nothing to do here,
/// the single call measures. Returns whether it measured.
/// `flags`: the overflow attribution of the list (kernels::Measures::nonfinite), or null.
bool measure_mixed(const std::vector<at::Tensor>& grads, at::Tensor& found,
                   std::vector<std::pair<double, at::Tensor>>& absmax, at::Tensor* flags = nullptr);
/// unscale_and_check of `grads` into `found`, measuring them (absmax per dtype; `flags` as above).
void unscale_measured(const std::vector<at::Tensor>& grads, float inv_scale, at::Tensor& found,
                      std::vector<std::pair<double, at::Tensor>>& absmax,
                      at::Tensor* flags = nullptr);

}  // namespace ampactor::detail
