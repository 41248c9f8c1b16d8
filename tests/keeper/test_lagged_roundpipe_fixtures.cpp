// The lagged policy against RoundPipe's own GradScaler around update(new_scale): trajectories
// written by the real package (tests/fixtures/roundpipe/make_fixtures.py, roundpipe 0.1.1, run by
// hand), replayed through the keeper core with RoundPipe's one-iteration lag.
#include "doctest_torch.h"

#include <ampactor/trace/rig.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

using namespace ampactor;

namespace {

/// One RoundPipe run: its settings, the schedule, and what RoundPipe did at every iteration.
struct RpCase {
  std::string name;
  double init_scale = 0, growth_factor = 0, backoff_factor = 0;
  std::int64_t growth_interval = 0;
  std::vector<double> gmax;                      // largest |gradient| at scale 1
  std::vector<std::optional<double>> new_scale;  // update(new_scale), or update()
  std::vector<double> scale;                     // the scale iteration k scaled and unscaled with
  std::vector<bool> found_inf;
  std::vector<double> next_scale;  // the scale update k made
  std::vector<std::int64_t> growth_tracker;

  std::size_t size() const { return gmax.size(); }
  GradScalerOptions options() const {
    return GradScalerOptions()
        .init_scale(init_scale)
        .growth_factor(growth_factor)
        .backoff_factor(backoff_factor)
        .growth_interval(growth_interval);
  }
  /// RoundPipe's double backoff: the first overflow in an iteration right after one whose
  /// update() backed off (its gradients predate that backoff), where the lagged policy backs off
  /// once by design. size() if none.
  std::size_t first_double() const {
    for (std::size_t k = 1; k < size(); ++k)
      if (found_inf[k] && !new_scale[k] && found_inf[k - 1] && !new_scale[k - 1]) return k;
    return size();
  }
};

struct RpFixtures {
  std::string roundpipe_version;
  std::vector<RpCase> cases;
};

double hex(const nlohmann::json& j) {
  return std::strtod(j.get<std::string>().c_str(), nullptr);
}

const RpFixtures& roundpipe_fixtures() {
  static const RpFixtures f = [] {
    // Beside this suite's sources (tests/keeper/ -> tests/fixtures/roundpipe/).
    const auto path = std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures" /
                      "roundpipe" / "lagged_new_scale.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path.string());
    const nlohmann::json doc = nlohmann::json::parse(in);
    RpFixtures out;
    out.roundpipe_version = doc.at("roundpipe_version").get<std::string>();
    for (const auto& c : doc.at("cases")) {
      RpCase r;
      r.name = c.at("name").get<std::string>();
      r.init_scale = hex(c.at("init_scale"));
      r.growth_factor = hex(c.at("growth_factor"));
      r.backoff_factor = hex(c.at("backoff_factor"));
      r.growth_interval = c.at("growth_interval").get<std::int64_t>();
      for (const auto& x : c.at("gmax"))
        r.gmax.push_back(hex(x));
      for (const auto& x : c.at("new_scale"))
        r.new_scale.push_back(x.is_null() ? std::nullopt : std::optional<double>(hex(x)));
      for (const auto& x : c.at("scale"))
        r.scale.push_back(hex(x));
      for (char ch : c.at("found_inf").get<std::string>())
        r.found_inf.push_back(ch == '1');
      for (const auto& x : c.at("next_scale"))
        r.next_scale.push_back(hex(x));
      for (const auto& x : c.at("growth_tracker"))
        r.growth_tracker.push_back(x.get<std::int64_t>());
      const std::size_t n = r.size();
      if (r.new_scale.size() != n || r.scale.size() != n || r.found_inf.size() != n ||
          r.next_scale.size() != n || r.growth_tracker.size() != n)
        throw std::runtime_error("lagged_new_scale.json: case '" + r.name + "' is ragged");
      out.cases.push_back(std::move(r));
    }
    return out;
  }();
  return f;
}

/// What the lagged keeper did with a case's schedule.
struct Replayed {
  std::vector<float> scale;  // the reply to ScaleRequest{k}
  std::vector<bool> found_inf;
  std::vector<UpdateApplied> applied;
};

/// The case's schedule through the lagged keeper core, messages as GradScaler sends them with
/// step jobs in flight: ScaleRequest{k} is answered before iteration k-1's reports arrive (the
/// lag RoundPipe has: iteration k scales with the scale update k-2 made), and update(new_scale)
/// is SetScale{k, s, after_jobs}, applied once the optimizer closes k. Overflow as fp16
/// gradients have it: scale * gmax above 65504 (the script checks RoundPipe's agree).
Replayed replay_lagged(const RpCase& c) {
  KeeperRig rig(c.options(), ScalePolicy::lagged);
  Replayed out;
  std::vector<KeeperInput> withheld;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const auto k = iteration_t(i);
    rig.send("t", ScaleRequest{k});
    for (const KeeperInput& w : withheld)
      rig.send("o", w);
    withheld.clear();
    REQUIRE(rig.replies("t").size() == i + 1);
    const auto* r = std::get_if<ScaleReply>(&rig.replies("t").back());
    REQUIRE(r);
    const bool inf = double(r->scale) * c.gmax[i] > 65504.0;
    out.scale.push_back(r->scale);
    out.found_inf.push_back(inf);
    withheld.push_back(UnscaleDone{k, 1, inf, r->scale});
    if (c.new_scale[i]) {
      rig.send("t", SetScale{k, *c.new_scale[i], /*after_jobs=*/true});
      withheld.push_back(IterationClosed{k, 1, false});
    } else {
      rig.send("t", UpdateScale{k, 1});
    }
  }
  for (const KeeperInput& w : withheld)
    rig.send("o", w);
  out.applied = rig.pushes();
  return out;
}

/// An overflow made at a scale larger than the one update(new_scale) set just before: the
/// issue's case.
bool older_scale_overflow(const RpCase& c, std::size_t k) {
  return k > 0 && c.found_inf[k] && !c.new_scale[k] && c.new_scale[k - 1] &&
         c.scale[k] > c.next_scale[k - 1];
}

}  // namespace

TEST_CASE("the RoundPipe fixtures come from roundpipe 0.1.1 and hold update(new_scale)'s cases") {
  const auto& f = roundpipe_fixtures();
  CHECK(f.roundpipe_version == "0.1.1");
  std::size_t older = 0, raised_then_inf = 0, growths = 0, doubles = 0, odd_scales = 0;
  for (const RpCase& c : f.cases) {
    doubles += c.first_double() < c.size();
    for (std::size_t k = 0; k < c.size(); ++k) {
      older += older_scale_overflow(c, k);
      raised_then_inf += k > 0 && c.found_inf[k] && !c.new_scale[k] && c.new_scale[k - 1] &&
                         c.scale[k] < c.next_scale[k - 1];
      growths += !c.new_scale[k] && c.next_scale[k] > (k ? c.next_scale[k - 1] : c.init_scale);
      odd_scales += c.new_scale[k] && (*c.new_scale[k] == 3000.0 || *c.new_scale[k] == 1000.5);
    }
  }
  CHECK(f.cases.size() >= 40);
  CHECK(older >= 20);
  CHECK(raised_then_inf > 0);
  CHECK(growths > 0);
  CHECK(odd_scales > 0);
  CHECK(doubles >= 3);
  CHECK(doubles < f.cases.size() / 4);
}

// After update(new_scale) the overflow of an iteration made at the older scale backs off from the
// new one, as in RoundPipe (the set scale answered no overflow). Only RoundPipe's double backoff
// still differs, by design: there the lagged policy backs off once.
TEST_CASE("lagged equals RoundPipe's real GradScaler around update(new_scale)") {
  std::size_t whole = 0, older_checked = 0;
  for (const RpCase& c : roundpipe_fixtures().cases) {
    CAPTURE(c.name);
    const Replayed got = replay_lagged(c);
    REQUIRE(got.applied.size() == c.size());
    const std::size_t d = c.first_double();
    // Update d is where the two part; the scale it makes is used from iteration d + 2 on.
    for (std::size_t k = 0; k < std::min(c.size(), d + 2); ++k) {
      CAPTURE(k);
      CHECK(got.scale[k] == c.scale[k]);
      CHECK(got.found_inf[k] == c.found_inf[k]);
    }
    for (std::size_t k = 0; k < std::min(c.size(), d); ++k) {
      CAPTURE(k);
      const UpdateApplied& a = got.applied[k];
      CHECK(a.k == iteration_t(k));
      CHECK(a.scale == c.next_scale[k]);
      CHECK(a.growth_tracker == c.growth_tracker[k]);
      older_checked += older_scale_overflow(c, k);
    }
    if (d == c.size()) {
      ++whole;
      continue;
    }
    // RoundPipe backs off again for the event update d-1 answered; lagged keeps that scale.
    const UpdateApplied& a = got.applied[d];
    CHECK(a.found_inf);
    CHECK_FALSE(a.backed_off);
    CHECK(a.scale == c.next_scale[d - 1]);
    CHECK(c.next_scale[d] == c.next_scale[d - 1] * c.backoff_factor);
    CHECK(a.growth_tracker == 0);
    CHECK(c.growth_tracker[d] == 0);
  }
  CHECK(whole >= 35);
  CHECK(older_checked >= 20);
}

// RoundPipe has no load_state_dict; a loaded scale is, like update(new_scale), no backoff: an
// overflow made before it at a larger scale backs off from it.
TEST_CASE("lagged: after a load that lowers the scale, an older overflow backs off from it") {
  KeeperRig rig(GradScalerOptions().init_scale(65536).growth_interval(1000), ScalePolicy::lagged);
  rig.send("t", ScaleRequest{0});
  rig.send("t", UpdateScale{0, 1});
  rig.send("t", ScaleRequest{1});
  rig.send("o", UnscaleDone{0, 1, false, 65536.0f});
  StateDictMsg sd;
  sd.empty = false;
  sd.scale = 1024;
  sd.growth_factor = 2;
  sd.backoff_factor = 0.5;
  sd.growth_interval = 1000;
  sd.growth_tracker = 5;
  rig.send("t", LoadStateDict{sd});
  rig.send("t", UpdateScale{1, 1});
  rig.send("o", UnscaleDone{1, 1, true, 65536.0f});  // made at 65536, before the load
  REQUIRE(rig.pushes().size() == 2);
  CHECK(rig.pushes()[1].backed_off);
  CHECK(rig.pushes()[1].scale == 512.0f);
  CHECK(rig.pushes()[1].growth_tracker == 0);
}

// One overflow event still costs one backoff after update(new_scale): an overflow made at the set
// scale, after the backoff that answered an earlier one made there, is not backed off again.
TEST_CASE("lagged: after update(new_scale), one overflow event is still one backoff") {
  KeeperRig rig(GradScalerOptions().init_scale(65536).growth_interval(1000), ScalePolicy::lagged);
  auto iteration = [&](iteration_t k, bool inf, float used) {
    rig.send("t", UpdateScale{k, 1});
    rig.send("o", UnscaleDone{k, 1, inf, used});
  };
  rig.send("t", SetScale{0, 4096.0});
  iteration(1, true, 4096.0f);  // backs off: 2048
  iteration(2, true, 4096.0f);  // the same event, made before that backoff: stays 2048
  iteration(3, true, 2048.0f);  // a new one: 1024
  REQUIRE(rig.pushes().size() == 4);
  CHECK(rig.pushes()[1].scale == 2048.0f);
  CHECK_FALSE(rig.pushes()[2].backed_off);
  CHECK(rig.pushes()[2].scale == 2048.0f);
  CHECK(rig.pushes()[3].scale == 1024.0f);
}
