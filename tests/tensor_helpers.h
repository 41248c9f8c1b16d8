// Helpers shared by the kernel and scaler tests.
#pragma once

#include <ATen/ATen.h>

#include "doctest_torch.h"

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
