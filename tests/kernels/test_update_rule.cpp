// The update rule of update_rule.h on its own, and kernels::update_scale on CPU tensors against
// it; the CUDA kernel is held to the same rule in test_kernels_cuda.cpp.
#include "doctest_torch.h"

#include <ampactor/core/update_rule.h>
#include <ampactor/kernels/update_scale.h>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>

#include "refusal.h"

using ampactor::apply_scale_rule;
using ampactor::errc;
using ampactor::ScaleRule;
using ampactor::ScaleRuleState;
using ampactor::UpdateOutcome;
using ampactor::test::Refusal;
using ampactor::test::refusal_of;
namespace k = ampactor::kernels;

namespace {
constexpr std::int32_t kMaxTracker = std::numeric_limits<std::int32_t>::max();

bool none(const UpdateOutcome& o) {
  return !o.backed_off && !o.grew && !o.growth_refused;
}
}  // namespace

static_assert(std::is_trivially_copyable_v<ScaleRule>, "a kernel takes the rule by value");

TEST_CASE("apply_scale_rule on found_inf backs off in double and resets the tracker") {
  const ScaleRule rule{2.0, 0.3, 5};
  ScaleRuleState s{1000.5f, 4};
  const UpdateOutcome o = apply_scale_rule(rule, s, true);
  CHECK(s.scale == static_cast<float>(double(1000.5f) * 0.3));
  CHECK(s.growth_tracker == 0);
  CHECK(o.backed_off);
  CHECK_FALSE(o.grew);
  CHECK_FALSE(o.growth_refused);
}

TEST_CASE("apply_scale_rule grows exactly when the tracker reaches the interval") {
  const ScaleRule rule{2.0, 0.5, 3};
  ScaleRuleState s{1024.0f, 0};
  for (std::int32_t expected_tracker : {1, 2}) {
    CHECK(none(apply_scale_rule(rule, s, false)));
    CHECK(s.scale == 1024.0f);
    CHECK(s.growth_tracker == expected_tracker);
  }
  const UpdateOutcome o = apply_scale_rule(rule, s, false);
  CHECK(o.grew);
  CHECK(s.scale == 2048.0f);
  CHECK(s.growth_tracker == 0);
}

TEST_CASE("apply_scale_rule with the tracker past the interval stalls growth until a backoff") {
  const ScaleRule rule{2.0, 0.5, 3};
  ScaleRuleState s{1024.0f, 5};
  for (std::int32_t step = 1; step <= 100; ++step) {
    CHECK(none(apply_scale_rule(rule, s, false)));
    CHECK(s.scale == 1024.0f);
    CHECK(s.growth_tracker == 5 + step);
  }
  apply_scale_rule(rule, s, true);
  CHECK(s.scale == 512.0f);
  CHECK(s.growth_tracker == 0);
  apply_scale_rule(rule, s, false);
  apply_scale_rule(rule, s, false);
  CHECK(apply_scale_rule(rule, s, false).grew);
  CHECK(s.scale == 1024.0f);
}

TEST_CASE("apply_scale_rule refuses to grow to a non-finite scale and still resets the tracker") {
  const ScaleRule rule{2.0, 0.5, 1};
  ScaleRuleState s{3.0e38f, 0};
  const UpdateOutcome o = apply_scale_rule(rule, s, false);
  CHECK(o.growth_refused);
  CHECK_FALSE(o.grew);
  CHECK(s.scale == 3.0e38f);
  CHECK(s.growth_tracker == 0);
}

TEST_CASE("apply_scale_rule keeps a tracker at INT32_MAX there instead of overflowing") {
  for (std::int64_t interval : {std::int64_t{2000}, std::int64_t{kMaxTracker}}) {
    CAPTURE(interval);
    const ScaleRule rule{2.0, 0.5, interval};
    ScaleRuleState s{1024.0f, kMaxTracker};
    CHECK(none(apply_scale_rule(rule, s, false)));
    CHECK(s.growth_tracker == kMaxTracker);
    CHECK(s.scale == 1024.0f);
    CHECK(apply_scale_rule(rule, s, true).backed_off);
    CHECK(s.growth_tracker == 0);
  }
  // The largest interval is still reachable.
  ScaleRuleState s{1024.0f, kMaxTracker - 1};
  CHECK(apply_scale_rule({2.0, 0.5, kMaxTracker}, s, false).grew);
  CHECK(s.scale == 2048.0f);
  CHECK(s.growth_tracker == 0);
}

TEST_CASE("update_scale on CPU tensors equals apply_scale_rule on random found_inf sequences") {
  std::mt19937 rng(5);
  for (std::int64_t interval : {1, 2, 3, 7}) {
    for (float start : {65536.0f, 3.0e38f, 1.0e-30f, 1000.5f}) {
      for (std::int32_t start_tracker : {0, 9}) {  // 9 > interval: growth stalls until a backoff
        CAPTURE(interval);
        CAPTURE(start);
        CAPTURE(start_tracker);
        // 1.1 and 0.3 are not binary fractions: double products round differently from float.
        const ScaleRule rule{1.1, 0.3, interval};
        at::Tensor scale = at::full({1}, start, at::kFloat);
        at::Tensor tracker = at::full({1}, start_tracker, at::kInt);
        at::Tensor found = at::zeros({1}, at::kFloat);
        ScaleRuleState want{start, start_tracker};
        for (int step = 0; step < 40; ++step) {
          const bool inf = rng() % 5 == 0;
          found.fill_(inf ? (step % 2 ? NAN : 1.0f) : 0.0f);
          k::update_scale(scale, tracker, found, rule.growth_factor, rule.backoff_factor,
                          rule.growth_interval);
          apply_scale_rule(rule, want, inf);
          REQUIRE(scale.item<float>() == want.scale);
          REQUIRE(tracker.item<std::int32_t>() == want.growth_tracker);
        }
      }
    }
  }
}

TEST_CASE("update_scale refuses bad input with its code and changes nothing") {
  at::Tensor scale = at::full({1}, 8.0f), tracker = at::full({1}, 2, at::kInt);
  at::Tensor found = at::zeros({1});
  struct Case {
    const char* what;
    at::Tensor s, t, f;
    std::int64_t interval;
    errc code;
    const char* part;
  };
  const errc bad_tensor = errc::invalid_gradients;
  const Case cases[] = {
      {"tracker not Int", scale, at::zeros({1}), found, 3, bad_tensor,
       "growth_tracker must be a Int"},
      {"two-element scale", at::full({2}, 8.0f), tracker, found, 3, bad_tensor,
       "exactly 1 element"},
      {"double found_inf", scale, tracker, at::zeros({1}, at::kDouble), 3, bad_tensor,
       "found_inf must be"},
      {"interval 0", scale, tracker, found, 0, errc::bad_growth_interval,
       "growth_interval must be at least 1"},
      {"meta found_inf", scale, tracker, at::zeros({1}, at::TensorOptions().device(at::kMeta)), 3,
       bad_tensor, "found_inf is on meta"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    at::Tensor s = c.s, t = c.t;
    const Refusal r = refusal_of([&] { k::update_scale(s, t, c.f, 2.0, 0.5, c.interval); });
    CHECK(r.code == c.code);
    CHECK(r.mentions(c.part));
    CHECK(scale.item<float>() == 8.0f);
    CHECK(tracker.item<std::int32_t>() == 2);
  }
}
