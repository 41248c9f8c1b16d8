// A strided tensor (or a pair of same-shaped tensors) as rows of strided elements, for the CPU
// loops. Internal to the kernels library.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace ampactor::kernels::cpu {

constexpr int kMaxDims = 16;

/// A tensor (or a pair of same-shaped tensors) seen as `rows` rows of `cols` elements: the
/// dimensions sorted by the first tensor's strides and merged where memory allows, so a dense
/// tensor of any dimension order is one row with unit stride.
struct Layout {
  int outer_dims = 0;  // dims before the row dim
  std::array<std::int64_t, kMaxDims> sizes{};
  std::array<std::int64_t, kMaxDims> strides[2]{};
  std::int64_t rows = 1, cols = 1, col_stride[2] = {1, 1};

  std::int64_t row_offset(int which, std::int64_t row) const {
    std::int64_t off = 0;
    for (int d = outer_dims - 1; d >= 0; --d) {
      off += (row % sizes[d]) * strides[which][d];
      row /= sizes[d];
    }
    return off;
  }
};

/// The layout of `a` (and of `b`, walked in a's order, when given).
Layout make_layout(const at::Tensor& a, const at::Tensor* b);

/// Sufficient test that no two elements share memory (see layout.cpp).
bool non_overlapping(const at::Tensor& t);

}  // namespace ampactor::kernels::cpu
