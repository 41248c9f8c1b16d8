// GradScalerOptions as named options: torch's defaults, chainable setters, and the setters'
// refusals (a value no scaler could hold), which throw and change nothing.
#include "doctest_torch.h"

#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

using namespace ampactor;

namespace {

bool same(const GradScalerOptions& a, const GradScalerOptions& b) {
  return a.init_scale() == b.init_scale() && a.growth_factor() == b.growth_factor() &&
         a.backoff_factor() == b.backoff_factor() && a.growth_interval() == b.growth_interval() &&
         a.enabled() == b.enabled() && a.allow_fp16_grads() == b.allow_fp16_grads();
}

// Options with no default left, so a setter that stored anything would show.
GradScalerOptions custom() {
  return GradScalerOptions()
      .init_scale(128)
      .growth_factor(3)
      .backoff_factor(0.25)
      .growth_interval(7)
      .enabled(false)
      .allow_fp16_grads(true);
}

/// The code `set` throws with (errc{} when it does not), checking that the options are unchanged.
errc refused(const std::function<void(GradScalerOptions&)>& set) {
  GradScalerOptions o = custom();
  try {
    set(o);
  } catch (const ScalerError& e) {
    CHECK(same(o, custom()));
    return e.code();
  }
  return errc{};
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::int64_t i32_max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t i32_min = std::numeric_limits<std::int32_t>::min();

}  // namespace

TEST_CASE("GradScalerOptions: torch's defaults") {
  const GradScalerOptions o;
  CHECK(o.init_scale() == 65536.0);
  CHECK(o.growth_factor() == 2.0);
  CHECK(o.backoff_factor() == 0.5);
  CHECK(o.growth_interval() == 2000);
  CHECK(o.enabled());
  CHECK_FALSE(o.allow_fp16_grads());
  CHECK_NOTHROW(o.validate());
}

TEST_CASE("GradScalerOptions: each setter stores its value and returns the options") {
  GradScalerOptions o;
  CHECK(&o.init_scale(128) == &o);
  CHECK(&o.growth_factor(3) == &o);
  CHECK(&o.backoff_factor(0.25) == &o);
  CHECK(&o.growth_interval(7) == &o);
  CHECK(&o.enabled(false) == &o);
  CHECK(&o.allow_fp16_grads(true) == &o);
  CHECK(o.init_scale() == 128.0);
  CHECK(o.growth_factor() == 3.0);
  CHECK(o.backoff_factor() == 0.25);
  CHECK(o.growth_interval() == 7);
  CHECK_FALSE(o.enabled());
  CHECK(o.allow_fp16_grads());
  CHECK(same(o, custom()));  // the chain on a temporary stores the same
}

TEST_CASE("GradScalerOptions: a setter refuses what no scaler could hold and changes nothing") {
  using O = GradScalerOptions;
  for (double v : {kNaN, kInf, -kInf, 1e39, -1e39, 0.0, -0.0, 1e-50, -1e-50}) {
    CAPTURE(v);  // NaN, or inf or 0 once it is the float scale
    CHECK(refused([v](O& o) { o.init_scale(v); }) == errc::bad_init_scale);
  }
  for (double v : {kNaN, kInf, -kInf}) {
    CAPTURE(v);
    CHECK(refused([v](O& o) { o.growth_factor(v); }) == errc::bad_growth_factor);
    CHECK(refused([v](O& o) { o.backoff_factor(v); }) == errc::bad_backoff_factor);
  }
  for (std::int64_t v : {i32_max + 1, i32_min - 1, std::numeric_limits<std::int64_t>::max(),
                         std::numeric_limits<std::int64_t>::min()}) {
    CAPTURE(v);
    CHECK(refused([v](O& o) { o.growth_interval(v); }) == errc::bad_growth_interval);
  }
  CHECK_THROWS_WITH_AS(O().growth_factor(kNaN), doctest::Contains("Got nan."), ScalerError);
  // torch's own texts where torch has one: c10's for a scale a float cannot hold.
  CHECK_THROWS_WITH_AS(O().init_scale(3.5e38), texts::float_overflow, ScalerError);
  CHECK_THROWS_WITH_AS(O().init_scale(-1e39), texts::float_overflow, ScalerError);
  CHECK_THROWS_WITH_AS(O().growth_interval(i32_max + 1), doctest::Contains("Got 2147483648."),
                       ScalerError);
}

TEST_CASE("GradScalerOptions: the setters take what a disabled scaler may hold") {
  // torch checks these only for an enabled scaler: validate() does, the setters do not.
  using O = GradScalerOptions;
  CHECK(refused([](O& o) { o.init_scale(-1); }) == errc{});
  constexpr double flt_max = std::numeric_limits<float>::max();
  CHECK(refused([](O& o) { o.init_scale(flt_max); }) == errc{});
  // Beyond float's range, as c10 refuses to convert it (even where it would round to the max).
  CHECK(refused([](O& o) { o.init_scale(std::nextafter(flt_max, kInf)); }) == errc::bad_init_scale);
  CHECK(refused([](O& o) { o.init_scale(0x1.ffffffp127); }) == errc::bad_init_scale);
  // A scale whose reciprocal is not a finite float (below 1 / FLT_MAX, about 2.9389e-39) would
  // unscale every finite gradient to inf: refused, whether enabled or not; just above, taken.
  CHECK(refused([](O& o) { o.init_scale(1e-45); }) == errc::bad_init_scale);
  CHECK(refused([](O& o) { o.init_scale(2.9e-39); }) == errc::bad_init_scale);
  CHECK_THROWS_WITH_AS(O().init_scale(2.9e-39),
                       doctest::Contains("its reciprocal, the unscale factor, must be a finite"),
                       ScalerError);
  // The bound printed is the smallest scale itself, to the digits that tell floats apart.
  CHECK_THROWS_WITH_AS(O().init_scale(2.9e-39),
                       doctest::Contains("must be at least 2.93873728e-39"), ScalerError);
  CHECK(refused([](O& o) { o.init_scale(2.95e-39); }) == errc{});
  CHECK(refused([](O& o) { o.growth_factor(0.5); }) == errc{});
  CHECK(refused([](O& o) { o.backoff_factor(-2); }) == errc{});
  CHECK(refused([](O& o) { o.growth_interval(i32_max); }) == errc{});
  CHECK(refused([](O& o) { o.growth_interval(i32_min); }) == errc{});
  const O odd = O().init_scale(-1).growth_factor(0.5).backoff_factor(2).growth_interval(0);
  CHECK_NOTHROW(O(odd).enabled(false).validate());
  CHECK_THROWS_AS(O(odd).validate(), ScalerError);
}

TEST_CASE("torch's positional constructor goes through the setters") {
  CHECK_NOTHROW(LocalGradScaler(-1, 0.5, 2, 0, /*enabled=*/false));
  CHECK_THROWS_AS(LocalGradScaler(kNaN, 2, 0.5, 1, /*enabled=*/false), ScalerError);
  try {
    LocalGradScaler(1, 0.5, 2, 1);  // enabled: torch's check and text
    FAIL("not refused");
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_growth_factor);
    CHECK(std::string(e.what()).find("The growth factor must be > 1.0.") == 0);
  }
}
