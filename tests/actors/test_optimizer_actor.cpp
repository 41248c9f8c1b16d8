// The optimizer actor and the keeper's unscale-count protocol under CAF's deterministic
// scheduler: jobs, reports, failures and cancellation, one message at a time.
#include "doctest_torch.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

#include "caf_fixture.h"
#include "scale_options.h"

using namespace ampactor;
using ampactor::test::Fixture;
using ampactor::test::opts;

namespace {

/// A keeper plus a scheduled (not detached) optimizer actor; the scoped actor subscribes to it.
struct OptFixture : Fixture {
  optimizer_actor optimizer;
  std::shared_ptr<std::atomic<std::uint64_t>> epoch =
      std::make_shared<std::atomic<std::uint64_t>>(0);

  explicit OptFixture(GradScalerOptions o = opts(128, 2, 0.5, 1),
                      ScalePolicy policy = ScalePolicy::exact)
      : Fixture(o, policy) {
    optimizer = spawn_optimizer_actor(sys, keeper, o,
                                      OptimizerActorOptions().detached(false).cancel_epoch(epoch));
    sched.run();
    send_to(optimizer, subscribe_atom::value, caf::actor_cast<trainer_actor>(self));
  }
  ~OptFixture() {
    caf::anon_send_exit(optimizer, caf::exit_reason::user_shutdown);
    sched.run();
  }
  ScaleParams params(iteration_t) {
    send(GetParams{true});
    auto p = take<ScaleParams>();
    REQUIRE(p);
    return *p;
  }
};

/// One parameter with a gradient of `value` everywhere, and SGD over it.
struct Model {
  at::Tensor w = at::zeros({4}).set_requires_grad(true);
  torch::optim::SGD opt{{w}, torch::optim::SGDOptions(1.0)};
  void grad(float value) { w.mutable_grad() = at::full({4}, value); }
};

}  // namespace

TEST_CASE("a job unscales with the scale it came with, reports UnscaleDone, steps or skips") {
  OptFixture f;
  Model m;
  f.send(ScaleRequest{0});
  REQUIRE(f.take<ScaleReply>()->scale == 128.0f);
  m.grad(64.0f);
  // The job carries 32, not the keeper's 128: the scale travels with the gradients.
  f.send_to(f.optimizer, StepJob{0, 32.0f, [&] { JobContext::current()->step(m.opt); }, 0});
  auto res = f.take<StepResult>();
  REQUIRE(res);
  CHECK(res->k == 0);
  CHECK(res->scale_used == 32.0f);
  CHECK_FALSE(res->skipped);
  auto done = f.take<JobDone>();
  REQUIRE(done);
  CHECK(done->unscales == 1);
  CHECK(m.w[0].item<float>() == -2.0f);  // 64 / 32 = 2, one SGD step with lr 1
  // The keeper got exactly one UnscaleDone: update 0 (expecting 1) applies at once.
  f.send(UpdateScale{0, 1});
  f.send_to(f.optimizer, CloseIteration{0, false});
  auto d = f.take<IterationDone>();
  REQUIRE(d);
  CHECK(d->steps.size() == 1);
  CHECK_FALSE(d->failed);
  CHECK(f.params(1).applied_through == 0);
  CHECK(f.params(1).scale == 256.0);

  // Iteration 1 overflows: skipped, backed off.
  m.grad(INFINITY);
  f.send_to(f.optimizer, StepJob{1, 256.0f, [&] { JobContext::current()->step(m.opt); }, 0});
  auto skip = f.take<StepResult>();
  REQUIRE(skip);
  CHECK(skip->skipped);
  CHECK(skip->found_inf);
  f.take<JobDone>();
  CHECK(m.w[0].item<float>() == -2.0f);
  f.send(UpdateScale{1, 1});
  CHECK(f.params(2).scale == 128.0);
}

TEST_CASE("unknown unscale count: the update waits for IterationClosed, in either order") {
  for (bool close_first : {false, true}) {
    CAPTURE(close_first);
    OptFixture f;
    Model m;
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    m.grad(1.0f);
    // Two unscales in one job (two optimizers would do the same).
    Model m2;
    m2.grad(INFINITY);
    auto job = StepJob{0, 128.0f, [&] {
                         JobContext::current()->step(m.opt);
                         JobContext::current()->unscale_(m2.opt);
                       }};
    if (close_first) {
      // The trainer's messages may reach the keeper before the optimizer has run the job.
      f.self->send(f.optimizer, job);
      f.self->send(f.keeper, UpdateWhenClosed{0});
      f.self->send(f.optimizer, CloseIteration{0, true});
      f.self->send(f.keeper, ScaleRequest{1});
      f.sched.prioritize(f.keeper);
      f.sched.run_once();
      f.sched.run_once();
      CHECK(f.idle());  // ScaleRequest{1} waits for update 0, which waits for the optimizer
      f.sched.run();
    } else {
      f.send_to(f.optimizer, job);
      REQUIRE(f.take<StepResult>());
      REQUIRE(f.take<JobDone>());
      f.send(UpdateWhenClosed{0});
      f.send(ScaleRequest{1});
      CHECK(f.idle());
      f.send_to(f.optimizer, CloseIteration{0, true});
    }
    // The mailbox now holds StepResult, JobDone, IterationDone and the ScaleReply, in some order.
    std::optional<ScaleReply> r;
    for (int i = 0; i < 6 && !r; ++i)
      if (auto x = f.take<ScaleReply>()) r = x;
    REQUIRE(r);
    CHECK(r->k == 1);
    CHECK(r->scale == 64.0f);  // m2 found inf: one backoff
  }
}

TEST_CASE("a failing job abandons its iteration: no update, error reported, actor alive") {
  OptFixture f(opts(128, 2, 0.5, 1));
  Model m;
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  m.grad(1.0f);
  f.send_to(f.optimizer, StepJob{0, 128.0f, [&] {
                                   JobContext::current()->unscale_(m.opt);
                                   throw std::runtime_error("boom");
                                 }});
  CHECK_FALSE(f.take<JobDone>());
  REQUIRE(f.last_error);
  CHECK(to_exception(f.last_error).code() == errc::step_failed);
  CHECK(std::string(to_exception(f.last_error).what()) == "boom");
  f.send(UpdateWhenClosed{0});
  f.send_to(f.optimizer, CloseIteration{0, true});
  auto d = f.take<IterationDone>();
  REQUIRE(d);
  CHECK(d->failed);
  CHECK(d->error_text == "boom");
  auto p = f.params(1);
  CHECK(p.applied_through == 0);
  CHECK(p.scale == 128.0);  // abandoned: no growth although the unscale was clean
  CHECK(p.growth_tracker == 0);
  // The next iteration runs normally.
  f.send_to(f.optimizer, StepJob{1, 128.0f, [&] { JobContext::current()->step(m.opt); }});
  f.take<StepResult>();
  REQUIRE(f.take<JobDone>());
  f.send(UpdateScale{1, 1});
  CHECK(f.params(2).scale == 256.0);
}

TEST_CASE("several failing jobs of an iteration: IterationDone keeps the first's code, names all") {
  OptFixture f(opts(128, 2, 0.5, 1));
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send_to(f.optimizer,
            StepJob{0, 128.0f, [] { throw ScalerError(errc::invalid_gradients, "first"); }});
  CHECK_FALSE(f.take<JobDone>());
  for (int j = 0; j < 10; ++j) {
    f.send_to(f.optimizer,
              StepJob{0, 128.0f, [j] { throw std::runtime_error("later " + std::to_string(j)); }});
    CHECK_FALSE(f.take<JobDone>());
  }
  f.send_to(f.optimizer, CloseIteration{0, false});
  auto d = f.take<IterationDone>();
  REQUIRE(d);
  CHECK(d->failed);
  CHECK(d->error_code == errc::invalid_gradients);
  CHECK(d->error_text.rfind("first\n", 0) == 0);
  for (int j = 0; j < 8; ++j)  // eight named, then their count
    CHECK(d->error_text.find("also failed in this iteration: later " + std::to_string(j) + "\n") !=
          std::string::npos);
  CHECK(d->error_text.find("later 8") == std::string::npos);
  CHECK(d->error_text.find("(and more failures in this iteration)") != std::string::npos);
}

TEST_CASE("an iteration closed without inf checks fails with torch's text and changes nothing") {
  OptFixture f;
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  f.send_to(f.optimizer, StepJob{0, 128.0f, [] {}});
  REQUIRE(f.take<JobDone>());
  f.send(UpdateWhenClosed{0});
  f.send_to(f.optimizer, CloseIteration{0, true});
  auto d = f.take<IterationDone>();
  REQUIRE(d);
  CHECK(d->failed);
  CHECK(d->error_code == errc::no_inf_checks_before_update);
  CHECK(d->error_text == texts::no_inf_checks_before_update);
  CHECK(f.params(1).scale == 128.0);
}

TEST_CASE("misuse inside a job keeps torch's error and refuses without changing the stage") {
  OptFixture f;
  Model m;
  m.grad(2.0f);
  std::string what;
  f.send_to(f.optimizer, StepJob{0, 2.0f, [&] {
                                   auto* job = JobContext::current();
                                   job->unscale_(m.opt);
                                   try {
                                     job->unscale_(m.opt);
                                   } catch (const ScalerError& e) {
                                     what = e.what();
                                   }
                                   CHECK(job->stage(m.opt) == OptState::unscaled);
                                   CHECK(job->found_inf(m.opt) == std::optional<bool>(false));
                                 }});
  REQUIRE(f.take<JobDone>());
  CHECK(what == texts::unscale_twice);
  CHECK(m.w.grad()[0].item<float>() == 1.0f);  // unscaled once only
}

TEST_CASE("jobs run in mailbox order, cancelled ones are dropped and abandon the iteration") {
  OptFixture f;
  std::vector<int> ran;
  f.self->send(f.optimizer, StepJob{0, 1.0f, [&] { ran.push_back(1); }, 0});
  f.self->send(f.optimizer, StepJob{0, 1.0f, [&] { ran.push_back(2); }, 0});
  f.sched.run();
  f.epoch->store(1);
  f.self->send(f.optimizer, StepJob{0, 1.0f, [&] { ran.push_back(3); }, 0});  // stale epoch
  f.self->send(f.optimizer, StepJob{0, 1.0f, [&] { ran.push_back(4); }, 1});
  f.self->send(f.optimizer, CloseIteration{0, true});
  f.sched.run();
  CHECK(ran == std::vector<int>{1, 2, 4});
  std::optional<IterationDone> d;
  for (int i = 0; i < 6 && !d; ++i)
    d = f.take<IterationDone>();
  REQUIRE(d);
  CHECK(d->cancelled_jobs == 1);
  CHECK_FALSE(d->failed);
  CHECK(f.params(1).applied_through == -1);  // no UpdateScale was sent: nothing applied
}

TEST_CASE("disabled: step calls optimizer.step() with no scaling and no reports") {
  const auto o = GradScalerOptions().enabled(false);
  OptFixture f(o);
  Model m;
  m.grad(3.0f);
  f.send_to(f.optimizer, StepJob{0, 1.0f, [&] {
                                   CHECK_FALSE(JobContext::current()->unscale_(m.opt));
                                   JobContext::current()->step(m.opt);
                                 }});
  auto done = f.take<JobDone>();
  REQUIRE(done);
  CHECK(done->unscales == 0);
  CHECK(m.w[0].item<float>() == -3.0f);
}

TEST_CASE("a subscriber with steps=false hears IterationDone but no StepResult") {
  OptFixture f;
  caf::scoped_actor quiet{f.sys};
  f.send_to(f.optimizer, subscribe_atom::value, caf::actor_cast<trainer_actor>(quiet), false);
  Model m;
  m.grad(1.0f);
  f.send_to(f.optimizer, StepJob{0, 128.0f, [&] { JobContext::current()->step(m.opt); }});
  f.send_to(f.optimizer, CloseIteration{0, false});
  REQUIRE(f.take<StepResult>());  // the full subscriber got the step
  std::vector<std::string> heard;
  while (!quiet->mailbox().empty())
    quiet->receive([&](const StepResult&) { heard.push_back("StepResult"); },
                   [&](const IterationDone& d) {
                     heard.push_back("IterationDone");
                     CHECK(d.steps.size() == 1);
                   });
  CHECK(heard == std::vector<std::string>{"IterationDone"});
}

TEST_CASE("counted unscales: the update applies on the job's own unscale, no further one") {
  // opts(128, 2, 0.5, 1): a clean update grows the scale to 256.
  OptFixture f;
  Model m, other;
  f.send(ScaleRequest{0});
  f.take<ScaleReply>();
  m.grad(1.0f);
  other.grad(1.0f);
  // The trainer counted the job's one unscale in advance: its update waits for that alone.
  f.send(UpdateScale{0, 1});
  f.send(ScaleRequest{1});
  CHECK(f.idle());
  std::string refused;
  StepJob job{0, 128.0f, [&] {
                JobContext::current()->step(m.opt);  // the counted unscale
                try {
                  JobContext::current()->unscale_(other.opt);  // one more comes too late
                } catch (const ScalerError& e) {
                  refused = e.what();
                }
              }};
  job.permit = UnscalePermit::exactly(1);
  f.send_to(f.optimizer, job);
  CHECK(refused.find("may not unscale") != std::string::npos);
  REQUIRE(f.take<StepResult>());
  auto done = f.take<JobDone>();
  REQUIRE(done);
  CHECK(done->unscales == 1);
  std::optional<ScaleReply> r;
  for (int i = 0; i < 4 && !r; ++i)
    r = f.take<ScaleReply>();
  REQUIRE(r);
  CHECK(r->scale == 256.0f);
  CHECK(m.w[0].item<float>() == -1.0f / 128.0f);
  CHECK(other.w.grad()[0].item<float>() == 1.0f);  // never unscaled
}

TEST_CASE("counted unscales not made: the keeper hears at once and the update changes nothing") {
  enum class How { throws, returns_short, cancelled };
  for (How how : {How::throws, How::returns_short, How::cancelled}) {
    CAPTURE(int(how));
    OptFixture f;
    Model m;
    f.send(ScaleRequest{0});
    f.take<ScaleReply>();
    m.grad(1.0f);
    f.send(UpdateScale{0, 1});
    StepJob job{0, 128.0f, [&] {
                  if (how == How::throws) throw std::runtime_error("move failed");
                }};
    job.permit = UnscalePermit::exactly(1);
    if (how == How::cancelled) f.epoch->store(1);
    f.send_to(f.optimizer, job);
    CHECK_FALSE(f.take<JobDone>());
    REQUIRE(f.last_error);
    const ScalerError e = to_exception(f.last_error);
    if (how == How::throws) CHECK(std::string(e.what()) == "move failed");
    if (how == How::returns_short)
      CHECK(std::string(e.what()) == "a step job counted to make 1 unscale(s) made 0");
    if (how == How::cancelled) CHECK(e.code() == errc::cancelled);
    // No CloseIteration yet: the optimizer told the keeper when the job ended.
    auto p = f.params(1);
    CHECK(p.applied_through == 0);
    CHECK(p.scale == 128.0);
    CHECK(p.growth_tracker == 0);
    f.send_to(f.optimizer, CloseIteration{0, false});
    auto d = f.take<IterationDone>();
    REQUIRE(d);
    // A job that ran and fell short failed its iteration; a cancelled one is counted as such.
    CHECK(d->failed == (how != How::cancelled));
    CHECK(d->cancelled_jobs == (how == How::cancelled ? 1 : 0));
    if (how == How::throws) CHECK(d->error_text == "move failed");
    if (how == How::returns_short)
      CHECK(d->error_text == "a step job counted to make 1 unscale(s) made 0");
  }
}

TEST_CASE("counted unscales with a disabled scaler ask for nothing") {
  const auto o = GradScalerOptions().enabled(false);
  OptFixture f(o);
  Model m;
  m.grad(3.0f);
  StepJob job{0, 1.0f, [&] { JobContext::current()->step(m.opt); }};
  job.permit = UnscalePermit::exactly(1);
  f.send_to(f.optimizer, job);
  auto done = f.take<JobDone>();
  REQUIRE(done);
  CHECK(done->unscales == 0);
  CHECK(m.w[0].item<float>() == -3.0f);
}

TEST_CASE("a job's StepResult carries the collapse guard's view of the scale the job came with") {
  OptFixture f;
  Model m;
  f.send(ScaleRequest{0});
  REQUIRE(f.take<ScaleReply>());
  m.grad(1.0f);
  StepJob job{0, 2.0f, [&] { JobContext::current()->step(m.opt); }, 0};
  job.guard = ScaleGuard{4, true};
  f.send_to(f.optimizer, std::move(job));
  auto res = f.take<StepResult>();
  REQUIRE(res);
  CHECK(res->guard == ScaleGuard{4, true});
  REQUIRE(f.take<JobDone>());
  f.send(UpdateScale{0, 1});
  f.send_to(f.optimizer, CloseIteration{0, false});
  auto d = f.take<IterationDone>();
  REQUIRE(d);
  REQUIRE(d->steps.size() == 1);
  CHECK(d->steps[0].guard == ScaleGuard{4, true});
  CHECK(d->overflow_ranks.empty());  // no ranks
}
