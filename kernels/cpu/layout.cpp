// Tensor layouts for the CPU loops (layout.h).
#include "layout.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace ampactor::kernels::cpu {

Layout make_layout(const at::Tensor& a, const at::Tensor* b) {
  const int n = int(a.dim());
  std::array<int, kMaxDims> order{};
  int kept = 0;
  for (int d = 0; d < n; ++d)
    if (a.size(d) != 1) order[kept++] = d;
  // Outermost first: larger stride of the first tensor first (stable keeps ties in dim order).
  std::stable_sort(order.begin(), order.begin() + kept,
                   [&](int x, int y) { return a.stride(x) > a.stride(y); });
  Layout l;
  std::int64_t sz[kMaxDims], st[2][kMaxDims];
  int m = 0;
  for (int i = 0; i < kept; ++i) {
    int d = order[i];
    std::int64_t s0 = a.stride(d), s1 = b ? b->stride(d) : s0, size = a.size(d);
    if (m > 0 && st[0][m - 1] == s0 * size && st[1][m - 1] == s1 * size) {
      sz[m - 1] *= size;  // merge into the outer dim
      st[0][m - 1] = s0;
      st[1][m - 1] = s1;
    } else {
      sz[m] = size;
      st[0][m] = s0;
      st[1][m] = s1;
      ++m;
    }
  }
  if (m == 0) {  // a scalar or all-ones shape
    l.rows = a.numel() == 0 ? 0 : 1;
    l.cols = 1;
    return l;
  }
  l.outer_dims = m - 1;
  l.cols = sz[m - 1];
  l.col_stride[0] = st[0][m - 1];
  l.col_stride[1] = st[1][m - 1];
  for (int d = 0; d < m - 1; ++d) {
    l.sizes[d] = sz[d];
    l.strides[0][d] = st[0][d];
    l.strides[1][d] = st[1][d];
    l.rows *= sz[d];
  }
  return l;
}

// Sufficient test that no two elements share memory: every dimension, sorted by stride, steps
// over the whole extent of the smaller ones. Slices, transposes and permutations all pass;
// expanded (stride 0) tensors do not.
bool non_overlapping(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return true;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size)
  for (int d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 0;  // max offset reachable by the smaller dims
  for (auto [stride, size] : dims) {
    if (stride <= extent) return false;
    extent += stride * (size - 1);
  }
  return true;
}

}  // namespace ampactor::kernels::cpu
