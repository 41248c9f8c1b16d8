// Overflow attribution (Measures::nonfinite): which gradients of a call held an inf or a NaN,
// against the planted ones, for every op, dtype and layout, on one thread and on two; the other
// results unchanged by it; and the refusals. The ctest entries kernels.attribution_* run these
// cases on the AVX2 and baseline loops too.
#include "doctest_torch.h"

#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <string>
#include <vector>

#include "refusal.h"
#include "tensor_helpers.h"

using namespace ampactor::test;
using ampactor::errc;
namespace k = ampactor::kernels;

namespace {

constexpr std::uint8_t kInf = k::kHeldInf, kNaN = k::kHeldNaN;

/// Five gradients: 0 and 2 clean, 1 an inf, 3 a NaN, 4 both; the first at `at` (a vector body or
/// a scalar tail), the others elsewhere.
std::vector<at::Tensor> planted(at::ScalarType dtype, Layout l, std::int64_t rows,
                                std::int64_t cols, std::int64_t at, std::uint64_t seed) {
  std::vector<at::Tensor> g;
  for (int i = 0; i < 5; ++i)
    g.push_back(make_grad(rows, cols, dtype, l, seed + std::uint64_t(i)));
  poison(g[1], Poison::inf, at);
  poison(g[3], Poison::nan, at);
  poison(g[4], Poison::inf, rows * cols - 1);
  poison(g[4], Poison::nan, 0);
  return g;
}

const std::vector<std::uint8_t> kWant = {0, kInf, 0, kNaN, kInf | kNaN};

std::vector<std::uint8_t> flags_of(const at::Tensor& f) {
  const at::Tensor c = f.cpu();
  return {c.data_ptr<std::uint8_t>(), c.data_ptr<std::uint8_t>() + c.numel()};
}

at::Tensor zero_flags(std::size_t n) {
  return at::zeros({std::int64_t(n)}, at::kByte);
}

/// Every op with nonfinite on copies of one list: the planted flags, and the same gradients,
/// masters, found_inf and grad_absmax as the call without it.
void check_ops(const std::vector<at::Tensor>& grads) {
  const std::size_t n = grads.size();
  auto a = clones(grads), b = clones(grads), c = clones(grads);
  at::Tensor f_plain = zero_flag(), m_plain = zero_flag();
  k::unscale_and_check(a, 0.25f, f_plain, m_plain);
  at::Tensor f = zero_flag(), m = zero_flag(), nf = zero_flags(n);
  k::unscale_and_check(b, 0.25f, f, k::Measures().grad_absmax(m).nonfinite(nf));
  CHECK(all_same(a, b));
  CHECK(f.item<float>() == f_plain.item<float>());
  CHECK(m.item<float>() == m_plain.item<float>());
  CHECK(flags_of(nf) == kWant);
  at::Tensor f2 = zero_flag(), nf2 = zero_flags(n);
  k::unscale_and_check(c, at::full({1}, 0.25f), f2, k::Measures().nonfinite(nf2));
  CHECK(all_same(a, c));
  CHECK(flags_of(nf2) == kWant);
  at::Tensor f3 = zero_flag(), nf3 = zero_flags(n);
  k::check_finite(grads, f3, k::Measures().nonfinite(nf3));
  CHECK(f3.item<float>() == 1.0f);
  CHECK(flags_of(nf3) == kWant);
  std::vector<at::Tensor> masters, plain_masters;
  for (const auto& g : grads) {
    masters.push_back(at::empty(g.sizes(), at::kFloat));
    plain_masters.push_back(at::empty(g.sizes(), at::kFloat));
  }
  at::Tensor f4 = zero_flag(), f5 = zero_flag(), nf4 = zero_flags(n);
  k::move_grads_and_unscale(grads, plain_masters, 0.5f, f4);
  k::move_grads_and_unscale(grads, masters, 0.5f, f5, k::Measures().nonfinite(nf4));
  CHECK(all_same(masters, plain_masters));
  CHECK(flags_of(nf4) == kWant);
  at::Tensor f6 = zero_flag(), nf5 = zero_flags(n);
  k::move_grads_and_unscale(grads, masters, at::full({1}, 0.5f), f6, k::Measures().nonfinite(nf5));
  CHECK(flags_of(nf5) == kWant);
}

}  // namespace

TEST_CASE("nonfinite names exactly the gradients that held inf or NaN, every op, dtype, layout") {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(name(l));
      check_ops(planted(dtype, l, 129, 33, 64 * 33 + 8, 5));  // in a vector body
      check_ops(planted(dtype, l, 17, 9, 17 * 9 - 2, 9));     // in a scalar tail
    }
  at::set_num_threads(threads);
}

TEST_CASE("nonfinite on the threaded path: chunks of one gradient on two threads, merged") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(name(l));
      check_ops(planted(dtype, l, 333, 1001, 333 * 1001 - 3, 21));
    }
  at::set_num_threads(threads);
}

TEST_CASE("nonfinite: a clean call leaves it 0, empty gradients are never flagged, never cleared") {
  std::vector<at::Tensor> g{make_grad(40, 50, at::kHalf, Layout::contiguous, 3),
                            at::empty({0}, at::kHalf),
                            make_grad(7, 3, at::kHalf, Layout::sliced, 4)};
  at::Tensor f = zero_flag(), nf = zero_flags(3);
  k::unscale_and_check(g, 0.5f, f, k::Measures().nonfinite(nf));
  CHECK(f.item<float>() == 0.0f);
  CHECK(flags_of(nf) == std::vector<std::uint8_t>{0, 0, 0});
  nf[1] = kNaN;  // set by an earlier call: kept
  poison(g[2], Poison::inf, 5);
  k::check_finite(g, f, k::Measures().nonfinite(nf));
  CHECK(flags_of(nf) == std::vector<std::uint8_t>{0, kNaN, kInf});
}

TEST_CASE("nonfinite: an unscale by an inverse scale above 1 may also report the inf it made") {
  // 30000 * 4 overflows fp16 in the multiply; the NaN is the only non-finite input.
  at::Tensor g = at::full({64}, 30000.0f).to(at::kHalf);
  g[9] = NAN;
  std::vector<at::Tensor> list{g};
  at::Tensor f = zero_flag(), nf = zero_flags(1);
  k::unscale_and_check(list, 4.0f, f, k::Measures().nonfinite(nf));
  CHECK(f.item<float>() == 1.0f);
  CHECK(flags_of(nf) == std::vector<std::uint8_t>{kNaN | kInf});
  at::Tensor f2 = zero_flag(), nf2 = zero_flags(1);
  g.fill_(30000.0f);
  g[9] = NAN;
  k::check_finite(list, f2, k::Measures().nonfinite(nf2));  // no multiply: the NaN alone
  CHECK(flags_of(nf2) == std::vector<std::uint8_t>{kNaN});
}

TEST_CASE("a bad nonfinite is refused before any gradient is touched") {
  std::vector<at::Tensor> g{make_grad(4, 4, at::kFloat, Layout::contiguous, 1),
                            make_grad(4, 4, at::kFloat, Layout::contiguous, 2)};
  const auto before = clones(g);
  auto refused = [&](const at::Tensor& nf, const char* why) {
    CAPTURE(why);
    at::Tensor f = zero_flag();
    const Refusal r =
        refusal_of([&] { k::unscale_and_check(g, 0.5f, f, k::Measures().nonfinite(nf)); });
    CHECK(r.code == errc::invalid_gradients);
    CHECK(r.mentions(why));
    CHECK(f.item<float>() == 0.0f);
    CHECK(all_same(g, before));
  };
  refused(at::zeros({2}, at::kInt), "must be a Byte (uint8) tensor");
  refused(zero_flags(3), "3 elements for 2 gradients");
  refused(at::zeros({4}, at::kByte).slice(0, 0, 4, 2), "must be contiguous");
  at::Tensor f = zero_flag();
  refused(f, "must be a Byte");
  const Refusal r = refusal_of([&] { k::check_finite(g, f, k::Measures().grad_absmax(f)); });
  CHECK(r.code == errc::invalid_gradients);
  CHECK(r.mentions("two tensors"));
}
