// The raw loops of every instruction-set variant, over every 16-bit pattern, against c10's
// conversions (the reference for torch's own results).
#include "doctest_torch.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "loops.h"

using ampactor::kernels::cpu::ElemType;
using ampactor::kernels::cpu::LoopTable;

namespace {

std::vector<const LoopTable*> tables() {
  std::vector<const LoopTable*> out{&ampactor::kernels::cpu::baseline_loops()};
  if (ampactor::kernels::cpu::has_avx2_f16c_fma())
    out.push_back(&ampactor::kernels::cpu::avx2_loops());
  else
    MESSAGE("this CPU has no AVX2/F16C/FMA: the AVX2 loops are not tested");
  if (ampactor::kernels::cpu::has_avx512())
    out.push_back(&ampactor::kernels::cpu::avx512_loops());
  else
    MESSAGE("this CPU has no AVX-512 F/BW/VL/DQ: the AVX-512 loops are not tested");
  return out;
}

float ref_to_float(ElemType t, std::uint16_t b) {
  return t == ElemType::f16 ? float(c10::Half(b, c10::Half::from_bits()))
                            : float(c10::BFloat16(b, c10::BFloat16::from_bits()));
}
std::uint16_t ref_from_float(ElemType t, float f) {
  return t == ElemType::f16 ? c10::Half(f).x : c10::BFloat16(f).x;
}
bool same16(ElemType t, std::uint16_t got, std::uint16_t want) {
  float g = ref_to_float(t, got), w = ref_to_float(t, want);
  if (std::isnan(w)) return std::isnan(g);  // NaN payloads may differ, NaN-ness may not
  return got == want;
}

}  // namespace

TEST_CASE("16-bit unscale and move match c10 conversions for all 65536 patterns") {
  for (const LoopTable* lt : tables()) {
    for (ElemType t : {ElemType::f16, ElemType::bf16}) {
      for (float inv : {0.5f, 3.0f, 1.0f / 65536.0f, 1e-3f, 7.0e4f}) {
        for (std::int64_t stride : {1, 3}) {
          CAPTURE(lt->name);
          CAPTURE(int(t));
          CAPTURE(inv);
          CAPTURE(stride);
          const std::int64_t n = 65536;
          std::vector<std::uint16_t> x(n * stride, 0), src(n * stride, 0);
          for (std::int64_t i = 0; i < n; ++i)
            x[i * stride] = src[i * stride] = std::uint16_t(i);
          CHECK(lt->unscale(t, x.data(), n, stride, inv,
                            nullptr));  // the patterns include inf and NaN
          std::vector<float> moved(n * stride, -1.0f);
          CHECK(lt->move(t, src.data(), stride, moved.data(), stride, n, inv, nullptr));
          int wrong_unscale = 0, wrong_move = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const float f = ref_to_float(t, std::uint16_t(i)) * inv;
            if (!same16(t, x[i * stride], ref_from_float(t, f))) ++wrong_unscale;
            const float m = moved[i * stride];
            if (std::isnan(f) ? !std::isnan(m) : std::memcmp(&m, &f, 4) != 0) ++wrong_move;
          }
          CHECK(wrong_unscale == 0);
          CHECK(wrong_move == 0);
          if (stride > 1) CHECK(x[1] == 0);  // the gaps are never written
        }
      }
    }
  }
}

TEST_CASE("16-bit check finds exactly the non-finite patterns, in every position") {
  for (const LoopTable* lt : tables()) {
    for (ElemType t : {ElemType::f16, ElemType::bf16}) {
      for (int pattern = 0; pattern < 65536; ++pattern) {
        const std::uint16_t b = std::uint16_t(pattern);
        const bool nonfinite = !std::isfinite(ref_to_float(t, b));
        // A short buffer of 1.0s with the pattern in the last slot: exercises the vector body
        // (n = 19 has two blocks of 8) and the scalar tail.
        std::vector<std::uint16_t> x(19, ref_from_float(t, 1.0f));
        x.back() = b;
        if (lt->check(t, x.data(), 19, 1, nullptr) != nonfinite ||
            lt->unscale(t, x.data(), 19, 1, 2.0f, nullptr) != nonfinite) {
          FAIL("wrong verdict for pattern " << pattern << " in " << lt->name);
        }
      }
    }
  }
}

TEST_CASE("float and double loops flag inf and NaN in body and tail") {
  for (const LoopTable* lt : tables()) {
    for (std::int64_t n : {1, 7, 8, 33, 1000}) {
      for (std::int64_t pos : {std::int64_t(0), n / 2, n - 1}) {
        for (double bad : {double(INFINITY), -double(INFINITY), double(NAN), 0.0}) {
          std::vector<float> f(n, 4.0f);
          std::vector<double> d(n, 4.0);
          f[pos] = float(bad);
          d[pos] = bad;
          const bool want = !std::isfinite(bad);
          CHECK(lt->check(ElemType::f32, f.data(), n, 1, nullptr) == want);
          CHECK(lt->check(ElemType::f64, d.data(), n, 1, nullptr) == want);
          CHECK(lt->unscale(ElemType::f32, f.data(), n, 1, 0.25f, nullptr) == want);
          CHECK(lt->unscale(ElemType::f64, d.data(), n, 1, 0.25f, nullptr) == want);
          for (std::int64_t i = 0; i < n; ++i) {
            if (i == pos) continue;
            CHECK(f[i] == 1.0f);
            CHECK(d[i] == 1.0);
          }
        }
      }
    }
  }
}

TEST_CASE("every variant agrees with the baseline at every length and writes nothing past it") {
  // Random 16-bit patterns (subnormals, inf and NaN included) in lengths around the vector widths
  // and their masked tails; a guard after the last element must stay untouched.
  const LoopTable& base = ampactor::kernels::cpu::baseline_loops();
  std::uint32_t seed = 12345;
  auto next = [&] { return std::uint16_t((seed = seed * 1664525u + 1013904223u) >> 16); };
  const std::uint16_t kGuard = 0x1234;
  for (const LoopTable* lt : tables()) {
    if (lt == &base) continue;
    const std::string name = lt->name;
    CAPTURE(name);
    for (ElemType t : {ElemType::f16, ElemType::bf16}) {
      for (float inv : {0.5f, 3.0f, 1.0f / 65536.0f, 7.0e4f}) {
        int wrong = 0;
        for (std::int64_t n = 0; n <= 140; ++n) {
          std::vector<std::uint16_t> src(std::size_t(n) + 1, kGuard);
          for (std::int64_t i = 0; i < n; ++i)
            src[std::size_t(i)] = next();
          for (bool with_max : {false, true}) {
            std::vector<std::uint16_t> a = src, b = src;
            std::vector<float> ma(std::size_t(n) + 1, -1.0f), mb = ma;
            float xa[3] = {0, 0, 0}, xb[3] = {0, 0, 0};
            const auto unscale = with_max ? &LoopTable::unscale_max : &LoopTable::unscale;
            const auto check = with_max ? &LoopTable::check_max : &LoopTable::check;
            const auto move = with_max ? &LoopTable::move_max : &LoopTable::move;
            wrong += (base.*check)(t, src.data(), n, 1, &xa[0]) !=
                     (lt->*check)(t, src.data(), n, 1, &xb[0]);
            wrong += (base.*move)(t, src.data(), 1, ma.data(), 1, n, inv, &xa[1]) !=
                     (lt->*move)(t, src.data(), 1, mb.data(), 1, n, inv, &xb[1]);
            wrong += (base.*unscale)(t, a.data(), n, 1, inv, &xa[2]) !=
                     (lt->*unscale)(t, b.data(), n, 1, inv, &xb[2]);
            wrong += std::memcmp(xa, xb, sizeof xa) != 0;
            for (std::int64_t i = 0; i < n; ++i) {
              wrong += !same16(t, b[std::size_t(i)], a[std::size_t(i)]);
              const float fa = ma[std::size_t(i)], fb = mb[std::size_t(i)];
              wrong += std::isnan(fa) ? !std::isnan(fb) : std::memcmp(&fa, &fb, 4) != 0;
            }
            wrong += b[std::size_t(n)] != kGuard || mb[std::size_t(n)] != -1.0f;
          }
        }
        CAPTURE(int(t));
        CAPTURE(inv);
        CHECK(wrong == 0);
      }
    }
  }
}
