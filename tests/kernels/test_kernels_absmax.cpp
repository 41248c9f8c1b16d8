// The gradient-size forms of the kernels (grad_absmax): the largest finite |gradient| of the call,
// against a plain reference, for every op, dtype, layout and poison, on one thread and on two;
// the loops of every instruction-set variant over every 16-bit pattern; and the refusals.
#include "doctest_torch.h"

#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "loops.h"
#include "refusal.h"
#include "tensor_helpers.h"

using namespace ampactor::test;
using ampactor::errc;
namespace k = ampactor::kernels;
namespace cpu = ampactor::kernels::cpu;

namespace {

// Reference: the largest |x| over the finite elements, in double, then to float toward zero (the
// kernels' rule for fp64; exact for the other dtypes, which are all floats).
float reference_absmax(const std::vector<at::Tensor>& grads) {
  double m = 0;
  for (const auto& g : grads) {
    at::Tensor d = g.to(at::kDouble).abs();
    d = at::where(at::isfinite(d), d, at::zeros_like(d));
    if (d.numel() > 0) m = std::max(m, d.max().item<double>());
  }
  float f = float(m);
  if (double(f) > m) f = std::nextafter(f, 0.0f);
  return f;
}

// The grads of a list with one known large value planted at `at` (a position in the vector body
// or in a scalar tail) so that the max is not left to chance.
std::vector<at::Tensor> planted(at::ScalarType dtype, Layout l, Poison p, std::int64_t rows,
                                std::int64_t cols, std::int64_t at_index, std::uint64_t seed) {
  std::vector<at::Tensor> out{make_grad(3, 5, dtype, l, seed),
                              make_grad(rows, cols, dtype, l, seed + 1),
                              make_grad(2, 7, dtype, l, seed + 2)};
  at::Tensor& big = out[1];
  big.select(0, at_index / cols).select(0, at_index % cols).fill_(-1000.0);
  poison(big, p, (at_index + 7) % (rows * cols));
  poison(out[2], p, 13);
  return out;
}

// Every op with and without grad_absmax on copies of one list: the same gradients, masters and
// found_inf, and the reference's max.
void check_ops(const std::vector<at::Tensor>& grads, Poison p) {
  const float want = reference_absmax(grads);
  const float want_found = p == Poison::none ? 0.0f : 1.0f;
  std::vector<at::Tensor> masters, plain_masters;
  for (const auto& g : grads) {
    masters.push_back(at::empty(g.sizes(), at::kFloat));
    plain_masters.push_back(at::empty(g.sizes(), at::kFloat));
  }
  auto a = clones(grads), b = clones(grads), c = clones(grads);
  at::Tensor f1 = zero_flag(), f2 = zero_flag(), m1 = zero_flag(), m2 = zero_flag(),
             m3 = zero_flag(), m4 = zero_flag(), f3 = zero_flag(), f4 = zero_flag(),
             f5 = zero_flag(), f6 = zero_flag();
  k::unscale_and_check(a, 0.25f, f1);
  k::unscale_and_check(b, 0.25f, f2, m1);
  CHECK(all_same(a, b));
  CHECK(f1.item<float>() == f2.item<float>());
  CHECK(f2.item<float>() == want_found);
  CHECK(m1.item<float>() == want);
  k::unscale_and_check(c, at::full({1}, 0.25f), f3, m2);
  CHECK(all_same(a, c));
  CHECK(m2.item<float>() == want);
  k::check_finite(grads, f4, m3);
  CHECK(f4.item<float>() == want_found);
  CHECK(m3.item<float>() == want);
  k::move_grads_and_unscale(grads, plain_masters, 0.5f, f5);
  k::move_grads_and_unscale(grads, masters, 0.5f, f6, m4);
  CHECK(all_same(masters, plain_masters));
  CHECK(f6.item<float>() == want_found);
  CHECK(m4.item<float>() == want);
}

}  // namespace

TEST_CASE("grad_absmax is the largest finite |gradient| for every op, dtype, layout and poison") {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  for_each_case([](at::ScalarType dtype, Layout l, Poison p) {
    // In a vector body, then in the scalar tail (the last element of 17 x 9).
    check_ops(planted(dtype, l, p, 129, 33, 64 * 33 + 8, 5), p);
    check_ops(planted(dtype, l, p, 17, 9, 17 * 9 - 1, 9), p);
  });
  at::set_num_threads(threads);
}

TEST_CASE("grad_absmax on the threaded path: each thread's max merged, the max in the last chunk") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for_each_case([](at::ScalarType dtype, Layout l, Poison p) {
    check_ops(planted(dtype, l, p, 333, 3001, 333 * 3001 - 3, 21), p);
  });
  at::set_num_threads(threads);
}

TEST_CASE("grad_absmax leaves out inf and NaN, is 0 for all-zero or empty lists, never lowered") {
  std::vector<at::Tensor> grads{at::full({9}, INFINITY), at::full({5}, NAN), at::zeros({3})};
  at::Tensor found = zero_flag(), m = zero_flag();
  k::unscale_and_check(grads, 0.5f, found, m);
  CHECK(found.item<float>() == 1.0f);
  CHECK(m.item<float>() == 0.0f);
  std::vector<at::Tensor> none;
  k::check_finite(none, found, m);
  CHECK(m.item<float>() == 0.0f);
  at::Tensor high = at::full({}, 1e30f);
  std::vector<at::Tensor> small{at::full({4}, 3.0f)};
  k::check_finite(small, found, high);
  CHECK(high.item<float>() == 1e30f);
  k::check_finite(small, found, m);
  CHECK(m.item<float>() == 3.0f);
}

TEST_CASE("an fp64 gradient's magnitude is rounded toward zero: finite stays finite") {
  for (double v : {1e300, double(FLT_MAX) * (1 + 1e-12), 1.0 + 1e-12, 0.1}) {
    CAPTURE(v);
    std::vector<at::Tensor> grads{at::full({7}, -v, at::kDouble)};
    at::Tensor found = zero_flag(), m = zero_flag();
    k::check_finite(grads, found, m);
    const float got = m.item<float>();
    CHECK(std::isfinite(got));
    CHECK(double(got) <= v);
    CHECK(double(std::nextafter(got, INFINITY)) > v);
  }
}

TEST_CASE("the *_max loops of every variant agree with c10 over all 65536 16-bit patterns") {
  std::vector<const cpu::LoopTable*> tables{&cpu::baseline_loops()};
  if (cpu::has_avx2_f16c_fma()) tables.push_back(&cpu::avx2_loops());
  if (cpu::has_avx512())
    tables.push_back(&cpu::avx512_loops());
  else
    MESSAGE("this CPU has no AVX-512 F/BW/VL/DQ: the AVX-512 loops are not tested");
  for (const cpu::LoopTable* lt : tables)
    for (cpu::ElemType t : {cpu::ElemType::f16, cpu::ElemType::bf16})
      for (std::int64_t stride : {1, 3}) {
        CAPTURE(lt->name);
        CAPTURE(int(t));
        CAPTURE(stride);
        // Each pattern alone after a run of zeros, at a position in the vector body or the tail:
        // the max is that pattern's magnitude where finite, else 0.
        int wrong = 0;
        for (std::uint32_t bits = 0; bits < 65536; ++bits) {
          const float v =
              t == cpu::ElemType::f16
                  ? float(c10::Half(std::uint16_t(bits), c10::Half::from_bits()))
                  : float(c10::BFloat16(std::uint16_t(bits), c10::BFloat16::from_bits()));
          const float want = std::isfinite(v) ? std::fabs(v) : 0.0f;
          const std::int64_t n = 75, at = bits % n;  // 2 blocks of 32, a vector, a tail
          std::vector<std::uint16_t> x(std::size_t(n * stride), 0);
          x[std::size_t(at * stride)] = std::uint16_t(bits);
          std::vector<float> dst(std::size_t(n * stride));
          float m_check = 0, m_unscale = 0, m_move = 0;
          lt->check_max(t, x.data(), n, stride, &m_check);
          lt->move_max(t, x.data(), stride, dst.data(), stride, n, 2.0f, &m_move);
          lt->unscale_max(t, x.data(), n, stride, 2.0f, &m_unscale);
          wrong += m_check != want || m_move != want || m_unscale != want;
        }
        CHECK(wrong == 0);
      }
}

TEST_CASE("a bad grad_absmax is refused before anything is touched") {
  auto grads = std::vector<at::Tensor>{make_grad(8, 8, at::kFloat, Layout::contiguous, 1)};
  const auto before = clones(grads);
  struct Case {
    const char* what;
    at::Tensor absmax;
    const char* part;
  };
  at::Tensor found = zero_flag();
  std::vector<Case> cases = {{"two elements", at::zeros({2}), "grad_absmax must have exactly 1"},
                             {"double", at::zeros({}, at::kDouble), "grad_absmax must be a Float"},
                             {"undefined", at::Tensor(), "grad_absmax is undefined"},
                             {"found_inf itself", found, "must be two tensors"}};
  for (auto& c : cases) {
    CAPTURE(c.what);
    const Refusal r = refusal_of([&] { k::unscale_and_check(grads, 0.5f, found, c.absmax); });
    CHECK(r.code == errc::invalid_gradients);
    CHECK(r.mentions(c.part));
    CHECK(all_same(grads, before));
    CHECK(found.item<float>() == 0.0f);
  }
}
