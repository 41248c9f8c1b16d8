// The scale_keeper under CAF's deterministic scheduler: each ordering on purpose.
#include "scale_keeper_fixture.h"

TEST_CASE("exact: ScaleRequest{k} waits for update k-1, which waits for its UnscaleDone") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  auto r0 = f.take<ScaleReply>();
  REQUIRE(r0);
  CHECK(r0->scale == 128.0f);
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});
  CHECK(f.idle());  // deferred: update 0 still lacks its UnscaleDone
  f.send(UnscaleDone{0, 7, false, 128.0f});
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->k == 1);
  CHECK(r1->scale == 256.0f);
}

TEST_CASE("UnscaleDone before UpdateScale: the update applies when it arrives") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 7, true, 128.0f});
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->scale == 64.0f);
}

TEST_CASE("two optimizers reporting in either order: one update, after both") {
  for (bool inf_first : {true, false}) {
    CAPTURE(inf_first);
    Fixture f(opts(128, 2, 0.5, 1));
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    f.send(UpdateScale{0, 2});
    f.send(GetParams{true});
    f.send(UnscaleDone{0, inf_first ? 1u : 2u, inf_first, 128.0f});
    CHECK(f.idle());  // one report is not enough
    f.send(UnscaleDone{0, inf_first ? 2u : 1u, !inf_first, 128.0f});
    auto p = f.take<ScaleParams>();
    REQUIRE(p);
    CHECK(p->scale == 64.0);  // backed off once
    CHECK(p->applied_through == 0);
  }
}

TEST_CASE("a known count short of its reports: an abandoned IterationClosed releases the update") {
  for (bool close_first : {true, false}) {
    CAPTURE(close_first);
    Fixture f(opts(128, 2, 0.5, 1));
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    if (close_first) f.send(IterationClosed{0, 1, true});
    f.send(UpdateScale{0, 2});
    f.send(UnscaleDone{0, 1, true, 128.0f});
    f.send(ScaleRequest{1});
    if (!close_first) {
      CHECK(f.idle());  // one of two reports: waits
      f.send(IterationClosed{0, 1, true});
    }
    auto r = f.take<ScaleReply>();
    REQUIRE(r);
    CHECK(r->scale == 128.0f);  // abandoned: the inf found changes nothing
    // A closed iteration that is not abandoned releases nothing: the count still rules.
    f.send(UpdateScale{1, 1});
    f.send(IterationClosed{1, 1, false});
    f.send(GetParams{true});
    CHECK(f.idle());
    f.send(UnscaleDone{1, 1, false, 128.0f});
    auto p = f.take<ScaleParams>();
    REQUIRE(p);
    CHECK(p->applied_through == 1);
    CHECK(p->scale == 256.0);
  }
}

TEST_CASE("getters: up_to_date waits for earlier updates, otherwise answers at once") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(GetParams{false});
  auto now = f.take<ScaleParams>();
  REQUIRE(now);
  CHECK(now->scale == 128.0);  // predates the pending update
  CHECK(now->applied_through == -1);
  f.send(GetParams{true});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto fresh = f.take<ScaleParams>();
  REQUIRE(fresh);
  CHECK(fresh->scale == 256.0);
  CHECK(fresh->applied_through == 0);
}

TEST_CASE("setters apply in mailbox order: after the updates sent before them") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(SetGrowthFactor{4.0});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 256.0);  // update 0 grew with the old factor 2
  CHECK(p->growth_factor == 4.0);
  f.send(UnscaleDone{1, 1, false, 256.0f});
  f.send(UpdateScale{1, 1});
  f.send(GetParams{true});
  auto q = f.take<ScaleParams>();
  REQUIRE(q);
  CHECK(q->scale == 1024.0);  // update 1 used the new factor
}

TEST_CASE("a refused setter or load changes nothing and answers with an error") {
  Fixture f(opts(128, 2, 0.5, 3));
  f.send(SetGrowthFactor{0.5});
  CHECK_FALSE(f.take<ScaleParams>());
  REQUIRE(f.last_error);
  CHECK(to_exception(f.last_error).code() == errc::bad_growth_factor);
  f.last_error = caf::error{};
  f.send(LoadStateDict{StateDictMsg{}});
  CHECK_FALSE(f.take<ScaleParams>());
  REQUIRE(f.last_error);
  CHECK(std::string(to_exception(f.last_error).what()) ==
        "The source state dict is empty, possibly because it was saved from a disabled instance "
        "of GradScaler.");
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->growth_factor == 2.0);
  CHECK(p->growth_interval == 3);
}

TEST_CASE("state_dict is a consistent snapshot: pending updates are applied first") {
  Fixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UpdateScale{0, 1});
  f.send(GetStateDict{});
  CHECK(f.idle());
  f.send(UnscaleDone{0, 1, false, 128.0f});
  auto sd = f.take<StateDictMsg>();
  REQUIRE(sd);
  CHECK_FALSE(sd->empty);
  CHECK(sd->scale == 256.0);
  // and it loads into a fresh keeper
  Fixture g;
  g.send(LoadStateDict{*sd});
  auto p = g.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 256.0);
}

TEST_CASE("UpdateScale with a new scale sets it and keeps the tracker, never applied twice") {
  Fixture f(opts(128, 2, 0.5, 10));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 1, false, 128.0f});
  f.send(UpdateScale{0, 1});
  f.send(SetScale{1, 5.0});
  f.send(SetScale{1, 9.0});                 // a duplicate of iteration 1 is dropped
  f.send(UnscaleDone{0, 1, true, 128.0f});  // a late report for an applied update too
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 5.0);
  CHECK(p->growth_tracker == 1);
  f.send(UnscaleDone{2, 1, false, 5.0f});
  f.send(UpdateScale{2, 1});
  f.send(GetParams{true});
  auto q = f.take<ScaleParams>();
  REQUIRE(q);
  CHECK(q->growth_tracker == 2);  // the late inf report did not reset it
}

TEST_CASE("subscribers receive UpdateApplied") {
  Fixture f(opts(8, 2, 0.5, 1));
  f.send(subscribe_atom::value, caf::actor_cast<trainer_actor>(f.self));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send(UnscaleDone{0, 1, true, 8.0f});
  f.send(UpdateScale{0, 1});
  auto a = f.take<UpdateApplied>();
  REQUIRE(a);
  CHECK(a->k == 0);
  CHECK(a->found_inf);
  CHECK(a->backed_off);
  CHECK(a->scale == 4.0f);
}

TEST_CASE("lagged: answered at once, one overflow event gives one backoff") {
  Fixture f(opts(1024, 2, 0.5, 100), ScalePolicy::lagged);
  f.send(ScaleRequest{0});
  CHECK(f.take<ScaleReply>()->scale == 1024.0f);
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});  // answered before update 0 is applied: one iteration late
  auto r1 = f.take<ScaleReply>();
  REQUIRE(r1);
  CHECK(r1->scale == 1024.0f);
  // Iteration 0 overflowed at 1024; iteration 1's grads, made with the same 1024, overflow too.
  f.send(UnscaleDone{0, 1, true, 1024.0f});
  f.send(UpdateScale{1, 1});
  f.send(UnscaleDone{1, 1, true, 1024.0f});
  f.send(GetParams{true});
  auto p = f.take<ScaleParams>();
  REQUIRE(p);
  CHECK(p->scale == 512.0);  // RoundPipe would be at 256
  CHECK(p->growth_tracker == 0);
}

// The exact policy over many random found_inf schedules and message orders equals the
// thread-free rule applied in iteration order.
