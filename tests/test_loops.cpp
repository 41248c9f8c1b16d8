// The raw loops of every instruction-set variant, over every 16-bit pattern, against c10's
// conversions (the reference for torch's own results).
#include "doctest_torch.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
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
    MESSAGE("this CPU has no AVX2/F16C/FMA: only the baseline loops are tested");
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
