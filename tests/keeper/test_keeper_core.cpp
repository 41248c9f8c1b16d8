// KeeperCore driven input by input (KeeperRig): the protocol checks that need no actors.
#include "doctest_torch.h"

#include <ampactor/trace/rig.h>

using namespace ampactor;

TEST_CASE("exact: a ScaleRequest that skips an iteration's update is a protocol_misuse error") {
  KeeperRig rig(GradScalerOptions{}, ScalePolicy::exact);
  rig.send("t", ScaleRequest{0});
  rig.send("t", ScaleRequest{1});  // UpdateScale{0} forgotten
  const auto& got = rig.replies("t");
  REQUIRE(got.size() == 2);
  const auto* err = std::get_if<KeeperError>(&got[1]);
  REQUIRE(err);
  CHECK(err->code == errc::protocol_misuse);
  CHECK(err->what.find("update of iteration 0 was never sent") != std::string::npos);
  // Nothing changed: once the update comes, the request is answered.
  rig.send("o", UnscaleDone{0, 1, false, 65536.0f});
  rig.send("t", UpdateScale{0, 1});
  rig.send("t", ScaleRequest{1});
  REQUIRE(rig.replies("t").size() == 3);
  CHECK(std::get<ScaleReply>(rig.replies("t")[2]).k == 1);
}

TEST_CASE("lagged: a ScaleRequest ahead of the updates is answered (RoundPipe's lag)") {
  KeeperRig rig(GradScalerOptions{}, ScalePolicy::lagged);
  rig.send("t", ScaleRequest{0});
  rig.send("t", ScaleRequest{1});
  REQUIRE(rig.replies("t").size() == 2);
  CHECK(std::holds_alternative<ScaleReply>(rig.replies("t")[1]));
}

TEST_CASE("subscribe twice pushes once, unsubscribe stops the pushes") {
  KeeperRig rig(GradScalerOptions{}, ScalePolicy::exact);
  const peer_id m = rig.peer("monitor");
  rig.send("monitor", Subscribe{m});
  rig.send("monitor", Subscribe{m});
  CHECK(rig.core().subscribers() == std::vector<peer_id>{m});
  rig.send("t", ScaleRequest{0});
  rig.send("t", SetScale{0, 8.0});
  REQUIRE(rig.pushes().size() == 1);
  rig.send("monitor", Unsubscribe{m});
  CHECK(rig.core().subscribers().empty());
  const auto outs = rig.send("t", SetScale{1, 4.0});
  REQUIRE(outs.size() == 1);  // still applied and recorded, pushed to nobody
  CHECK(std::get<KeeperPush>(outs[0]).to.empty());
}

TEST_CASE("monitor queries need no iteration and answer in mailbox order") {
  KeeperRig rig(GradScalerOptions{}, ScalePolicy::exact);
  rig.send("t", ScaleRequest{0});
  rig.send("t", UpdateScale{0, 1});
  rig.send("m", GetParams{true});  // waits behind update 0
  CHECK(rig.replies("m").empty());
  rig.send("m", SetGrowthInterval{0});  // refused, after the getter
  rig.send("o", UnscaleDone{0, 1, true, 65536.0f});
  const auto& got = rig.replies("m");
  REQUIRE(got.size() == 2);
  CHECK(std::get<ScaleParams>(got[0]).scale == 32768.0);
  CHECK(std::get<KeeperError>(got[1]).code == errc::bad_growth_interval);
  CHECK(rig.core().state().growth_interval() == 2000);
}

TEST_CASE(
    "update(new_scale) after jobs waits for the iteration's close and changes nothing when "
    "the iteration was abandoned") {
  for (bool abandoned : {false, true}) {
    CAPTURE(abandoned);
    KeeperRig rig(GradScalerOptions().init_scale(64), ScalePolicy::exact);
    rig.send("t", ScaleRequest{0});
    rig.send("t", SetScale{0, 8.0, /*after_jobs=*/true});
    CHECK(rig.core().params().applied_through == -1);  // not before the optimizer closed 0
    rig.send("o", IterationClosed{0, 0, abandoned});
    CHECK(rig.core().params().applied_through == 0);
    CHECK(rig.core().params().scale == (abandoned ? 64.0f : 8.0f));
    REQUIRE_FALSE(rig.pushes().empty());
    CHECK(rig.pushes().back().abandoned == abandoned);
  }
}

TEST_CASE("UpdateApplied says below_one exactly while the scale after the update is below 1") {
  // torch's rule at 4 with backoff 0.5: overflows take it to 2, 1, 0.5, 0.25; growth back to 0.5.
  KeeperRig rig(GradScalerOptions().init_scale(4).growth_interval(1), ScalePolicy::exact);
  const peer_id m = rig.peer("monitor");
  rig.send("monitor", Subscribe{m});
  const bool overflow[] = {true, true, true, true, false, false, false};
  rig.send("t", ScaleRequest{0});
  for (iteration_t k = 0; k < 7; ++k) {
    rig.send("o", UnscaleDone{k, 1, overflow[k], 1.0f});
    rig.send("t", UpdateScale{k, 1});
    rig.send("t", ScaleRequest{k + 1});
  }
  REQUIRE(rig.pushes().size() == 7);
  const float want[] = {2, 1, 0.5f, 0.25f, 0.5f, 1, 2};
  for (std::size_t i = 0; i < 7; ++i) {
    CAPTURE(i);
    const UpdateApplied& a = rig.pushes()[i];
    CHECK(a.scale == want[i]);
    CHECK(a.below_one == (want[i] < 1));
  }
}

TEST_CASE("every rule's UpdateApplied says below_one exactly while its scale is below 1") {
  // Backoffs from 4 with each rule's preset, the minimum (where a rule has one) moved below 1:
  // the scale passes 1 on the way down and climbs back with clean steps. tf's floor is fixed at
  // 1, so its scale never goes below 1 and below_one never becomes true.
  for (RuleKind kind : {RuleKind::torch, RuleKind::deepspeed, RuleKind::megatron, RuleKind::apex,
                        RuleKind::colossalai, RuleKind::keras, RuleKind::tf, RuleKind::jmp}) {
    CAPTURE(rule_name(kind));
    auto o = GradScalerOptions::preset(kind).init_scale(4).growth_interval(1);
    if (kind != RuleKind::keras && kind != RuleKind::tf) o.min_scale(1.0 / 64);
    if (kind == RuleKind::deepspeed) o.raise_at_min_scale(false);
    KeeperRig rig(o, ScalePolicy::exact);
    const peer_id m = rig.peer("monitor");
    rig.send("monitor", Subscribe{m});
    rig.send("t", ScaleRequest{0});
    for (iteration_t k = 0; k < 20; ++k) {
      rig.send("o", UnscaleDone{k, 1, k < 10, 1.0f});  // 10 overflows, then 10 clean steps
      rig.send("t", UpdateScale{k, 1});
      rig.send("t", ScaleRequest{k + 1});
    }
    REQUIRE(rig.pushes().size() == 20);
    int below = 0;
    for (const UpdateApplied& a : rig.pushes()) {
      CAPTURE(a.k);
      CHECK(a.below_one == (a.scale < 1.0f));
      below += a.below_one;
    }
    if (kind == RuleKind::tf) {
      CHECK(below == 0);
    } else {
      CHECK(below > 0);
      CHECK_FALSE(rig.pushes().back().below_one);  // back above 1 after the clean steps
    }
  }
}

TEST_CASE("the collapse guard's view rides on UpdateApplied and ScaleReply at the exact update") {
  // 8 -> 4 -> 2 -> 1 -> 0.5 -> 0.25 (overflows 0 to 4), then clean steps; the guard trips at the
  // third backoff in a row (k = 2) and stays tripped while the scale is below 0.5.
  const auto o =
      GradScalerOptions().init_scale(8).growth_interval(100).collapse_backoffs(3).collapse_below(
          0.5);
  KeeperRig rig(o, ScalePolicy::exact);
  const peer_id m = rig.peer("monitor");
  rig.send("monitor", Subscribe{m});
  rig.send("t", ScaleRequest{0});
  for (iteration_t k = 0; k < 8; ++k) {
    rig.send("o", UnscaleDone{k, 1, k <= 4, 1.0f});
    rig.send("t", UpdateScale{k, 1});
    rig.send("t", ScaleRequest{k + 1});
  }
  REQUIRE(rig.pushes().size() == 8);
  const std::int64_t in_row[] = {1, 2, 3, 4, 5, 0, 0, 0};
  const bool collapsing[] = {false, false, true, true, true, true, true, true};
  for (std::size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    const UpdateApplied& a = rig.pushes()[i];
    CHECK(a.guard.backoffs_in_row == in_row[i]);
    CHECK(a.guard.collapsing == collapsing[i]);
    // The reply to ScaleRequest{k + 1} describes the same scale.
    const auto& reply = std::get<ScaleReply>(rig.replies("t")[i + 1]);
    CHECK(reply.scale == a.scale);
    CHECK(reply.guard == a.guard);
  }
  CHECK_FALSE(std::get<ScaleReply>(rig.replies("t")[0]).guard.collapsing);  // the initial scale
  rig.send("t", SetScale{8, 64.0});  // a scale the user chose: the guard starts again
  CHECK(rig.pushes().back().guard == ScaleGuard{0, false});
}
