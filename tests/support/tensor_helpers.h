// Helpers shared by the kernel and scaler tests.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include "doctest_torch.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ampactor::test {

enum class Layout { contiguous, transposed, sliced };
enum class Poison { none, inf, nan };

inline const char* name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::transposed ? "transposed" : "sliced";
}
inline const char* name(Poison p) {
  return p == Poison::none ? "none" : p == Poison::inf ? "inf" : "nan";
}

inline const at::ScalarType kGradTypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
inline const Layout kLayouts[] = {Layout::contiguous, Layout::transposed, Layout::sliced};
inline const Poison kPoisons[] = {Poison::none, Poison::inf, Poison::nan};

/// Runs `fn(dtype, layout, poison)` over the whole grid, each case captured for failure reports.
template <typename F>
void for_each_case(F&& fn) {
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts)
      for (Poison p : kPoisons) {
        CAPTURE(c10::toString(dtype));
        CAPTURE(name(l));
        CAPTURE(name(p));
        fn(dtype, l, p);
      }
}

/// A rows x cols tensor of `dtype` in the given layout: transposed is a dense non-contiguous
/// view, sliced is a non-dense view (every other row, a column range) of a larger tensor.
inline at::Tensor make_grad(std::int64_t rows, std::int64_t cols, at::ScalarType dtype, Layout l,
                            std::uint64_t seed) {
  at::manual_seed(seed);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  switch (l) {
    case Layout::contiguous:
      return (at::randn({rows, cols}, opts) * 8).to(dtype);
    case Layout::transposed:
      return (at::randn({cols, rows}, opts) * 8).to(dtype).t();
    case Layout::sliced:
      return (at::randn({rows * 2, cols + 5}, opts) * 8)
          .to(dtype)
          .slice(0, 0, rows * 2, 2)
          .slice(1, 2, cols + 2);
  }
  return {};
}

/// Writes inf or NaN at a flat (logical) index of t.
inline void poison(at::Tensor& t, Poison p, std::int64_t flat_index) {
  if (p == Poison::none) return;
  const std::int64_t cols = t.size(1);
  t.select(0, flat_index / cols)
      .select(0, flat_index % cols)
      .fill_(p == Poison::inf ? INFINITY : NAN);
}

/// Element-wise equal, treating NaN as equal to NaN and nothing else.
inline bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  at::Tensor an = at::isnan(a), bn = at::isnan(b);
  if (!at::equal(an, bn)) return false;
  return at::equal(at::where(an, at::zeros_like(a), a), at::where(bn, at::zeros_like(b), b));
}

/// LibTorch 2.x's CPU float sqrt is not correctly rounded (torch 2.15: about one result in five
/// is an ulp off), and its Adam and AdamW take it; the fused ones' sqrt is correctly rounded. So
/// against LibTorch 2.x they are held within a stated bound instead of bit for bit. SGD takes no
/// sqrt and stays bit for bit; against LibTorch 1.x everything is bit for bit.
inline constexpr bool kTorchSqrtRounded = TORCH_VERSION_MAJOR < 2;

/// The largest |a - b| in units of the dtype's epsilon (fp32 2^-23, fp16 2^-10, bf16 2^-7) times
/// the largest |b| of the tensor: how many last places of its largest values they differ by.
/// -1 when dtype, shape or NaN positions differ. NaN and infinite values are skipped.
inline double ulps_apart(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return -1;
  const at::Tensor an = at::isnan(a), bn = at::isnan(b);
  if (!at::equal(an, bn)) return -1;
  if (a.numel() == 0) return 0;
  const double eps = a.scalar_type() == at::kFloat  ? 0x1p-23
                     : a.scalar_type() == at::kHalf ? 0x1p-10
                     : a.scalar_type() == at::kBFloat16
                         ? 0x1p-7
                         : throw std::invalid_argument("ulps_apart: fp32, fp16 or bf16 only");
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  const at::Tensor finite = at::isfinite(x).logical_and(at::isfinite(y));
  const at::Tensor zero = at::zeros({}, at::kDouble);
  const double top = at::where(finite, y.abs(), zero).max().item<double>();
  const double d = at::where(finite, (x - y).abs(), zero).max().item<double>();
  if (d == 0) return 0;
  return d / (eps * top);
}

/// A fresh 1-element fp32 found_inf (or grad_absmax) of 0 on the CPU.
inline at::Tensor zero_flag() {
  return at::zeros({}, at::kFloat);
}

inline std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (auto& t : ts)
    out.push_back(t.clone());
  return out;
}

/// same_values for every pair of two equally long lists.
inline bool all_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_values(a[i], b[i])) return false;
  return true;
}

}  // namespace ampactor::test
