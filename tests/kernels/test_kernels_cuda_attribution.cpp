// Overflow attribution on the GPU (Measures::nonfinite): the planted gradients named exactly, as
// the CPU kernels name them, for every op, dtype and layout, over lists long enough for several
// launches with empty gradients between, and in the last block of a large gradient. Skipped
// without a device.
#include "kernels_cuda_fixture.h"

namespace {

constexpr std::uint8_t kInf = k::kHeldInf, kNaN = k::kHeldNaN;

}  // namespace

#ifdef AMPACTOR_CUDA_BUILT
TEST_CASE("raw launchers: attribution slots must not decrease, refused before any launch") {
  // Validation only: nothing reaches the device, so no GPU is needed.
  float found = 0;
  unsigned char flags[2] = {0, 0};
  std::uint16_t data[4] = {0, 0, 0, 0};
  const k::gpu::Span spans[2] = {{data, 2, k::gpu::DType::f16}, {data + 2, 2, k::gpu::DType::f16}};
  const std::uint32_t slots[2] = {1, 0};
  CHECK(k::gpu::check_finite(spans, 2, &found, nullptr, nullptr, {flags, slots}) ==
        k::gpu::kInvalidInput);
  CHECK(k::gpu::check_finite(spans, 2, &found, nullptr, nullptr, {flags, nullptr}) ==
        k::gpu::kInvalidInput);
}
#endif

#ifdef AMPACTOR_TORCH_CUDA
namespace {

std::vector<std::uint8_t> flags_of(const at::Tensor& f) {
  const at::Tensor c = f.cpu();
  return {c.data_ptr<std::uint8_t>(), c.data_ptr<std::uint8_t>() + c.numel()};
}

/// Every op on CUDA copies of `grads` (CPU tensors): the flags of each against `want`, and
/// against the CPU kernels' on the same list.
void check_ops(const std::vector<at::Tensor>& grads, const std::vector<std::uint8_t>& want) {
  const auto dev = at::TensorOptions().device(at::kCUDA);
  const std::int64_t n = std::int64_t(grads.size());
  std::vector<at::Tensor> a, b, src, masters;
  for (const auto& g : grads) {
    a.push_back(g.to(at::kCUDA));
    b.push_back(g.to(at::kCUDA));
    src.push_back(g.to(at::kCUDA));
    masters.push_back(at::empty(g.sizes(), dev));
  }
  at::Tensor f = at::zeros({1}, dev), cpu_f = at::zeros({});
  at::Tensor nf1 = at::zeros({n}, dev.dtype(at::kByte)), nf2 = at::zeros({n}, dev.dtype(at::kByte)),
             nf3 = at::zeros({n}, dev.dtype(at::kByte)), cpu_nf = at::zeros({n}, at::kByte);
  k::check_finite(grads, cpu_f, k::Measures().nonfinite(cpu_nf));
  k::unscale_and_check(a, at::full({1}, 0.25f, dev), f, k::Measures().nonfinite(nf1));
  k::check_finite(b, f, k::Measures().nonfinite(nf2).grad_absmax(at::zeros({1}, dev)));
  k::move_grads_and_unscale(src, masters, 0.5f, f, k::Measures().nonfinite(nf3));
  CHECK(flags_of(cpu_nf) == want);
  CHECK(flags_of(nf1) == want);
  CHECK(flags_of(nf2) == want);
  CHECK(flags_of(nf3) == want);
}

}  // namespace

TEST_CASE("CUDA tensors: nonfinite names the gradients that held inf or NaN, as the CPU does") {
  SKIP_WITHOUT_GPU();
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(name(l));
      std::vector<at::Tensor> g;
      for (int i = 0; i < 5; ++i)
        g.push_back(make_grad(129, 33, dtype, l, 40 + std::uint64_t(i)));
      poison(g[1], Poison::inf, 64 * 33 + 8);
      poison(g[3], Poison::nan, 129 * 33 - 1);  // the scalar tail
      poison(g[4], Poison::inf, 3);
      poison(g[4], Poison::nan, 100 * 33);
      check_ops(g, {0, kInf, 0, kNaN, kInf | kNaN});
    }
}

TEST_CASE("CUDA tensors: nonfinite over 2100 gradients with empty ones, and a large one's end") {
  SKIP_WITHOUT_GPU();
  std::vector<at::Tensor> g;
  std::vector<std::uint8_t> want;
  for (int i = 0; i < 2100; ++i) {
    // Every 7th empty: a batch's slots then skip some; a few flagged ones in every launch.
    g.push_back(i % 7 == 0 ? at::empty({0, 3}, at::kHalf)
                           : make_grad(3 + i % 5, 3, at::kHalf, Layout::contiguous, i));
    want.push_back(0);
    if (i % 7 != 0 && i % 97 == 5) {
      poison(g.back(), i % 2 ? Poison::inf : Poison::nan, 2);
      want.back() = i % 2 ? kInf : kNaN;
    }
  }
  // 3000 x 1000 elements: its last block (8192 elements) holds the NaN.
  g.push_back(make_grad(3000, 1000, at::kBFloat16, Layout::contiguous, 7));
  poison(g.back(), Poison::nan, 3000 * 1000 - 1);
  want.push_back(kNaN);
  check_ops(g, want);
}
#endif
