// Measuring gradients while they are checked: each dtype's largest size (absmax against that
// dtype's largest value) and which gradients held inf or NaN, in the same pass as the check.
#include <ampactor/kernels/unscale.h>
#include <ampactor/scaler/step_tracker.h>

#include "measure.h"

#include <ATen/ops/zeros.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <limits>

namespace ampactor {

double dtype_max_of(c10::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return 65504.0;
    case at::kBFloat16:
      return double(std::numeric_limits<c10::BFloat16>::max());
    case at::kFloat:
      return double(std::numeric_limits<float>::max());
    case at::kDouble:
      return std::numeric_limits<double>::max();
    default:
      return 0;
  }
}

namespace detail {

at::Tensor zero_on(c10::Device device) {
  return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

/// Groups a list by dtype so that each gets its own grad_absmax: a size is only comparable with
/// its own dtype's largest value.
std::vector<std::pair<c10::ScalarType, std::vector<std::size_t>>> by_dtype(
    const std::vector<at::Tensor>& ts) {
  std::vector<std::pair<c10::ScalarType, std::vector<std::size_t>>> out;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto& e) { return e.first == ts[i].scalar_type(); });
    if (it == out.end()) it = out.insert(out.end(), {ts[i].scalar_type(), {}});
    it->second.push_back(i);
  }
  return out;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<std::size_t>& i) {
  std::vector<at::Tensor> out;
  out.reserve(i.size());
  for (std::size_t j : i)
    out.push_back(ts[j]);
  return out;
}

/// The flags of one kernel call over `n` gradients, and their positions 0..n-1 in its list.
Attributed whole_list(std::size_t n, c10::Device device) {
  Attributed a;
  a.flags = at::zeros({std::int64_t(n)}, at::TensorOptions().dtype(at::kByte).device(device));
  for (std::size_t i = 0; i < n; ++i)
    a.params.push_back(i);
  return a;
}

bool measure_mixed(const std::vector<at::Tensor>& grads, at::Tensor& found, AbsmaxList& absmax,
                   std::vector<Attributed>* attributed) {
  const auto groups = by_dtype(grads);
  if (groups.size() <= 1) return false;
  for (const auto& [dtype, index] : groups) {
    at::Tensor a = zero_on(found.device());
    auto m = kernels::Measures().grad_absmax(a);
    if (attributed) {  // this dtype's flags, at its gradients' positions in the list
      attributed->push_back({whole_list(index.size(), found.device()).flags, index});
      m.nonfinite(attributed->back().flags);
    }
    kernels::check_finite(pick(grads, index), found, m);
    absmax.emplace_back(dtype_max_of(dtype), a);
  }
  return true;
}

/// unscale_and_check of `grads` into `found`, measuring them (absmax per dtype).
void unscale_measured(const std::vector<at::Tensor>& grads, float inv_scale, at::Tensor& found,
                      AbsmaxList& absmax, std::vector<Attributed>* attributed) {
  kernels::Measures m;
  if (attributed) {  // the one call over the whole list names them
    attributed->push_back(whole_list(grads.size(), found.device()));
    m.nonfinite(attributed->back().flags);
  }
  if (measure_mixed(grads, found, absmax)) {
    kernels::unscale_and_check(grads, inv_scale, found, m);
  } else {
    at::Tensor a = zero_on(found.device());
    kernels::unscale_and_check(grads, inv_scale, found, m.grad_absmax(a));
    if (!grads.empty()) absmax.emplace_back(dtype_max_of(grads[0].scalar_type()), a);
  }
}

}  // namespace detail

void check_measured(const std::vector<at::Tensor>& grads, at::Tensor& found, AbsmaxList& absmax,
                    std::vector<Attributed>* attributed) {
  if (detail::measure_mixed(grads, found, absmax, attributed)) return;
  at::Tensor a = detail::zero_on(found.device());
  auto m = kernels::Measures().grad_absmax(a);
  if (attributed) {
    attributed->push_back(detail::whole_list(grads.size(), found.device()));
    m.nonfinite(attributed->back().flags);
  }
  kernels::check_finite(grads, found, m);
  if (!grads.empty()) absmax.emplace_back(dtype_max_of(grads[0].scalar_type()), a);
}

}  // namespace ampactor
