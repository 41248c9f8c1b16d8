// The scale-collapse guard: said once on stderr when the scale backs off N times in a row or falls
// below a threshold, raised instead on request with the state intact, and always raised before a
// scale no checkpoint can hold.
#include "doctest_torch.h"

#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/core/state_dict.h>
#include <cstdlib>

#include <cmath>
#include <iostream>
#include <sstream>

#include "refusal.h"

using namespace ampactor;
using ampactor::test::refusal_of;

namespace {

/// stderr while it lives.
struct Stderr {
  std::ostringstream text;
  std::streambuf* old = std::cerr.rdbuf(text.rdbuf());
  ~Stderr() { std::cerr.rdbuf(old); }
};

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1))
    ++n;
  return n;
}

}  // namespace

TEST_CASE("collapse guard: N backoffs in a row are said once, at the N-th, on torch's trajectory") {
  Stderr err;
  ScaleState s(GradScalerOptions().init_scale(1024).collapse_backoffs(4).collapse_below(0));
  s.lazy_init();
  s.update(true), s.update(false);  // a clean step ends a run of backoffs
  for (int i = 0; i < 3; ++i)
    s.update(true);
  CHECK(err.text.str().empty());
  CHECK(s.backoffs_in_row() == 3);
  s.update(true);  // the 4th in a row
  CHECK(err.text.str() ==
        "ampactor: the loss scale backed off 4 times in a row (the last 4 backoffs: 512 -> 256 -> "
        "128 -> 64 -> 32): every scale tried overflows, so the inf or NaN may come from the model "
        "itself (GradScalerOptions::raise_on_collapse stops the run here).\n");
  for (int i = 0; i < 5; ++i)
    s.update(true);
  CHECK(count(err.text.str(), "in a row") == 1);
  CHECK(s.scale() == 1024.0f / 2 / 512);  // torch's trajectory: 10 backoffs, unchanged
}

TEST_CASE("collapse guard: a scale below collapse_below is said once") {
  Stderr err;
  ScaleState s(GradScalerOptions().init_scale(1024).collapse_below(100).collapse_backoffs(0));
  s.lazy_init();
  for (int i = 0; i < 3; ++i)
    s.update(true);  // 512, 256, 128
  CHECK(err.text.str().empty());
  s.update(true);  // 64
  s.update(true);
  CHECK(err.text.str() ==
        "ampactor: the loss scale fell below 100 (64): gradients are now scaled down, and small "
        "ones underflow. A min_scale (GradScalerOptions) floors it.\n");
}

TEST_CASE(
    "collapse guard: raise_on_collapse throws at that update with the history, nothing changed") {
  ScaleState s(
      GradScalerOptions().init_scale(1024).collapse_backoffs(3).collapse_below(0).raise_on_collapse(
          true));
  s.lazy_init();
  s.update(true), s.update(true);  // 512, 256
  const ScaleState before = s;
  const auto r = refusal_of([&] { s.update(true); });
  CHECK(r.code == errc::scale_collapsed);
  CHECK(r.what ==
        "ampactor: the loss scale backed off 3 times in a row (the last 3 backoffs: 1024 -> 512 -> "
        "256 -> 128); nothing changed: update(new_scale) or a load resumes the run");
  CHECK(s == before);
  CHECK(s.backoffs_in_row() == 2);
  CHECK(refusal_of([&] { s.update(true); }).code == errc::scale_collapsed);  // it stays stopped
  s.set_scale(4096);  // update(new_scale): the count starts again
  s.update(true), s.update(true);
  CHECK(s.scale() == 1024.0f);
  // And below a threshold.
  ScaleState t(GradScalerOptions().init_scale(8).collapse_below(3).raise_on_collapse(true));
  t.lazy_init();
  t.update(true);  // 4
  CHECK(refusal_of([&] { t.update(true); }).what.find("would fall below 3 (to 2)") !=
        std::string::npos);
  CHECK(t.scale() == 4.0f);
}

TEST_CASE("a torch-rule run whose scale collapses stops before a scale no checkpoint can hold") {
  // torch's backoff has no floor: at 0.5 a step, its float scale reaches the denormals and then 0,
  // a state load_state_dict refuses. ampactor stops at the last scale that loads back.
  Stderr err;  // the guard's two warnings on the way down
  ScaleState s(GradScalerOptions().init_scale(65536));
  s.lazy_init();
  int updates = 0;
  for (;; ++updates) {
    const float next = float(double(s.scale()) * 0.5);  // torch's next scale
    const auto r = refusal_of([&] { s.update(true); });
    if (r.code == errc::scale_collapsed) {
      CHECK(next < smallest_scale());  // torch would go on below it
      CHECK(r.what.find("the loss scale would fall to") != std::string::npos);
      // Both scales printed so that each reads back as itself (6 digits printed both alike).
      const auto at = r.what.find("would fall to ") + 14;
      // strtof: stof refuses a denormal as out of range.
      CHECK(std::strtof(r.what.substr(at, r.what.find(',', at) - at).c_str(), nullptr) == next);
      CHECK(r.what.find(", below 2.93873728e-39, the smallest scale") != std::string::npos);
      CHECK(std::strtof("2.93873728e-39", nullptr) == smallest_scale());
      break;
    }
    REQUIRE(updates < 400);
  }
  CHECK(s.scale() >= smallest_scale());
  CHECK(s.scale() / 2 < smallest_scale());
  // Every state the run reached loads back.
  ScaleState again(GradScalerOptions().init_scale(65536));
  load_state_dict(again, make_state_dict(s));
  again.lazy_init();
  CHECK(again.scale() == s.scale());
}

TEST_CASE("collapse guard options: bad values refused as the types they are stored in") {
  GradScalerOptions o;
  CHECK(refusal_of([&] { o.collapse_backoffs(-1); }).code == errc::bad_rule);
  CHECK(refusal_of([&] { o.collapse_backoffs(std::int64_t(1) << 31); }).code == errc::bad_rule);
  CHECK(refusal_of([&] { o.collapse_below(-1); }).code == errc::bad_rule);
  CHECK(refusal_of([&] { o.collapse_below(NAN); }).code == errc::bad_rule);
  CHECK(refusal_of([&] { o.collapse_below(1e39); }).what ==  // inf as a float
        "collapse_below must be finite and >= 0 as a float. Got 9.9999999999999994e+38.");
  CHECK(o.collapse_backoffs() == 10);
  CHECK(o.collapse_below() == 1.0);
  CHECK_FALSE(o.raise_on_collapse());
}

TEST_CASE("collapsing() holds from the update that trips the guard, every time, until it is over") {
  Stderr err;
  ScaleState s(GradScalerOptions().init_scale(8).collapse_backoffs(2).collapse_below(0.5));
  s.lazy_init();
  CHECK_FALSE(s.collapsing());
  s.update(true);  // 4: one backoff
  CHECK_FALSE(s.collapsing());
  s.update(true);  // 2: the second in a row
  CHECK(s.collapsing());
  s.update(false);  // a clean step ends the run, 2 is not below 0.5
  CHECK_FALSE(s.collapsing());
  s.update(true), s.update(true), s.update(true);  // 1, 0.5, 0.25: a run again, and below 0.5
  CHECK(s.collapsing());
  s.update(false);  // the run is over, the scale still below 0.5
  CHECK(s.backoffs_in_row() == 0);
  CHECK(s.collapsing());
  s.set_scale(64);  // a scale the user chose
  CHECK_FALSE(s.collapsing());
  CHECK(count(err.text.str(), "in a row") == 1);  // said once, reported every time
}
