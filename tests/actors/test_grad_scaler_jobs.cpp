// The actor-backed GradScaler: draining and cancelling jobs, state_dict, disabled scalers, the
// caller's actor system and a user's own trainer.
#include "grad_scaler_fixture.h"

#include <future>
#include <iostream>
#include <sstream>
#include <string>

TEST_CASE("destruction drains queued jobs, cancel() drops those not started") {
  std::atomic<int> ran{0};
  {
    GradScaler scaler(opts(128, 2, 0.5, 1));
    scaler.scale(at::ones({1}));
    for (int i = 0; i < 5; ++i)
      scaler.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++ran;
      });
  }
  CHECK(ran == 5);

  ran = 0;
  {
    GradScaler scaler(opts(128, 2, 0.5, 1));
    scaler.scale(at::ones({1}));
    std::promise<void> started, release;
    auto gate = release.get_future().share();
    scaler.submit([&] {
      started.set_value();
      gate.wait_for(std::chrono::seconds(30));
      ++ran;
    });
    for (int i = 0; i < 5; ++i)
      scaler.submit([&] { ++ran; });
    scaler.update();
    REQUIRE(started.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    scaler.cancel();
    release.set_value();
    scaler.sync();
    IterationResult r = scaler.wait_result(0);
    CHECK(r.cancelled_jobs == 5);
    CHECK_FALSE(r.failed);
    CHECK(scaler.get_scale() == 128.0);  // the cancelled iteration changed nothing
    // Jobs submitted after cancel() run.
    scaler.scale(at::ones({1}));
    scaler.submit([&] { ++ran; });
  }
  CHECK(ran == 2);
}

// FinishJobs is deprecated (the pipeline owns its optimizer now) but works for one release.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_CASE(
    "FinishJobs (deprecated, kept one release): a scope left by an exception waits for the queued "
    "jobs to finish") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  std::atomic<int> ran{0};
  try {
    std::vector<int> used_by_the_job(1000, 1);  // declared before the guard: it goes after
    FinishJobs finish(scaler);
    scaler.scale(at::ones({1}));
    scaler.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int v : used_by_the_job)
        ran += v;
    });
    throw std::runtime_error("the trainer fails");
  } catch (const std::runtime_error&) {
    CHECK(ran == 1000);  // the job had finished when its data went
  }
}
#pragma GCC diagnostic pop

TEST_CASE(
    "finish_jobs() waits for a failing job too, throws nothing, and update() + sync() still report "
    "the error") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  std::atomic<int> ran{0};
  scaler.scale(at::ones({1}));
  scaler.submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++ran;
    throw std::runtime_error("job 0 fails");
  });
  scaler.finish_jobs();
  CHECK(ran == 1);  // the job had run to its end when finish_jobs() returned
  // As after any failed job, the error is reported once: by update() (after it has closed the
  // iteration) if its report has reached the main thread by then, else by sync().
  std::string by_update;
  try {
    scaler.update();
  } catch (const std::exception& e) {
    by_update = e.what();
  }
  if (by_update.empty())
    CHECK_THROWS_WITH(scaler.sync(), "job 0 fails");
  else
    CHECK_NOTHROW(scaler.sync());
  CHECK((by_update.empty() || by_update == "job 0 fails"));
  CHECK(scaler.get_scale() == 128.0);  // the failed iteration changed nothing
}

TEST_CASE("state_dict: a consistent snapshot, and a round trip through a fresh scaler") {
  GradScaler a(opts(128, 2, 0.5, 2));
  Net net;
  for (int k = 0; k < 3; ++k) {
    a.scale(at::ones({1}));
    net.set_grads({at::ones({7}), at::ones({5, 3})});
    a.step(*net.opt);
    a.update();
  }
  StateDict sd = a.state_dict();
  CHECK(sd.get_double("scale") == 256.0);
  CHECK(sd.get_int("_growth_tracker") == 1);
  a.set_growth_interval(5);
  CHECK(a.get_growth_interval(true) == 5);
  GradScaler b;
  b.load_state_dict(sd);
  CHECK(b.get_scale() == 256.0);
  CHECK(b.get_growth_interval() == 2);
  CHECK(b.state_dict().get_int("_growth_tracker") == 1);

  GradScaler off(opts(128, 2, 0.5, 2).enabled(false));
  CHECK(off.state_dict().empty());
  CHECK(off.get_scale() == 1.0);
  CHECK_FALSE(off.is_enabled());
  off.load_state_dict(sd);  // a disabled scaler ignores it, as torch does
  CHECK(off.get_scale() == 1.0);
}

namespace {
/// SGD that notes the thread each step() runs on.
struct ThreadNotingSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  std::vector<std::thread::id> threads;
  at::Tensor step(LossClosure closure = nullptr) override {
    threads.push_back(std::this_thread::get_id());
    return torch::optim::SGD::step(std::move(closure));
  }
};
}  // namespace

TEST_CASE("disabled: scale returns its input, step runs optimizer.step() on the optimizer thread") {
  GradScaler scaler(opts(128, 2, 0.5, 1).enabled(false));
  Net net;
  ThreadNotingSGD opt(net.params, torch::optim::SGDOptions(0.1));
  at::Tensor x = at::ones({3});
  CHECK(scaler.scale(x).is_same(x));
  std::thread::id optimizer_thread;
  scaler.run_on_optimizer([&] { optimizer_thread = std::this_thread::get_id(); });
  for (int k = 0; k < 2; ++k) {
    net.set_grads({at::ones({7}), at::ones({5, 3})});
    CHECK(scaler.step(opt).has_value());
    scaler.update();
  }
  CHECK(net.params[0][0].item<float>() == doctest::Approx(-0.2));
  REQUIRE(opt.threads.size() == 2);
  CHECK(optimizer_thread != std::this_thread::get_id());
  CHECK(opt.threads[0] == optimizer_thread);
  CHECK(opt.threads[1] == optimizer_thread);
}

TEST_CASE("a scaler in the caller's actor system") {
  caf::actor_system_config cfg;
  register_messages(cfg);
  caf::actor_system sys{cfg};
  {
    GradScaler scaler(sys, opts(8, 2, 0.5, 1));
    Net net;
    scaler.scale(at::ones({1}));
    net.set_grads({at::ones({7}), at::ones({5, 3})});
    scaler.step(*net.opt);
    scaler.update();
    CHECK(scaler.get_scale() == 16.0);
  }
}

// ---- a trainer of the user's own: an event-based actor driving iterations purely by messages ----
namespace {

struct TrainerState {
  ScalerActors actors;
  Workload w;
  Net* net = nullptr;
  iteration_t k = 0;
  iteration_t n = 0;
  Trajectory t;
  iteration_t closed = 0;
  std::promise<Trajectory>* out = nullptr;
};

using trainer_ptr = trainer_actor::stateful_pointer<TrainerState>;

/// One iteration: ask the keeper for the scale, make the gradients with it, hand them to the
/// optimizer with that scale, then update and close the iteration. Never blocks.
void iterate(trainer_ptr self) {
  if (self->state.k == self->state.n) return;
  self->request(self->state.actors.keeper, caf::infinite, ScaleRequest{self->state.k})
      .then([=](const ScaleReply& r) {
        auto& st = self->state;
        st.t.scales.push_back(r.scale);
        Net* net = st.net;
        auto g = st.w.grads(r.k, r.scale);
        auto fn = [net, g] {
          net->set_grads(g);
          JobContext::current()->step(*net->opt);
        };
        self->request(st.actors.optimizer, caf::infinite, StepJob{r.k, r.scale, fn, 0})
            .then([=](const JobDone& d) {
              auto& s = self->state;
              self->send(s.actors.keeper, UpdateScale{d.k, d.unscales});
              self->send(s.actors.optimizer, CloseIteration{d.k, false});
              ++s.k;
              iterate(self);
            });
      });
}

trainer_actor::behavior_type user_trainer(trainer_ptr self, ScalerActors actors, Workload w,
                                          Net* net, iteration_t n, std::promise<Trajectory>* out) {
  auto& st = self->state;
  st.actors = actors;
  st.w = w;
  st.net = net;
  st.n = n;
  st.out = out;
  self->send(actors.optimizer, subscribe_atom::value, caf::actor_cast<trainer_actor>(self));
  iterate(self);
  return {
      [](const StepResult&) {},
      [=](const IterationDone& d) {
        auto& s = self->state;
        s.t.skipped.push_back(d.skipped());
        if (++s.closed == s.n) {
          // Every update was sent before the last close: ask for the final state, then finish.
          self->request(s.actors.keeper, caf::infinite, GetParams{true})
              .then([=](const ScaleParams& p) {
                auto& s2 = self->state;
                s2.t.final_scale = p.scale;
                for (auto& prm : s2.net->params)
                  s2.t.params.push_back(prm.detach().clone());
                s2.out->set_value(s2.t);
                self->quit();
              });
        }
      },
      [](const UpdateApplied&) {},
  };
}

}  // namespace

TEST_CASE("a user's event-based trainer reproduces the facade's results exactly") {
  const GradScalerOptions o = opts(65536, 2, 0.5, 3);
  for (std::uint64_t seed : {4u, 5u}) {
    CAPTURE(seed);
    Workload w{seed};
    Trajectory facade = run_actors(o, w, /*adam=*/true, Mode::main_step);

    caf::actor_system_config cfg;
    register_messages(cfg);
    caf::actor_system sys{cfg};
    Net net(/*adam=*/true);
    std::promise<Trajectory> done;
    auto result = done.get_future();
    {
      ScalerActors actors = spawn_scaler_actors(sys, o);
      sys.spawn(user_trainer, actors, w, &net, iteration_t(kIters), &done);
      REQUIRE(result.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
      caf::anon_send_exit(actors.optimizer, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(actors.keeper, caf::exit_reason::user_shutdown);
    }
    Trajectory mine = result.get();
    CHECK(mine.scales == facade.scales);
    CHECK(mine.skipped == facade.skipped);
    CHECK(mine.final_scale == facade.final_scale);
    for (std::size_t i = 0; i < facade.params.size(); ++i)
      CHECK(mine.params[i].equal(facade.params[i]));
  }
}

TEST_CASE(
    "a job that fails in the last, still open iteration is written to stderr at "
    "destruction") {
  std::ostringstream err;
  std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
  {
    GradScaler scaler(opts(128, 2, 0.5, 1));
    scaler.scale(at::ones({1}));
    scaler.submit([] { throw std::runtime_error("the last job failed"); });
    // no update(): the iteration is still open when the scaler goes
  }
  std::cerr.rdbuf(old);
  CHECK(err.str().find("unreported step-job error (iteration 0): the last job failed") !=
        std::string::npos);
}

TEST_CASE("every failed job of an iteration is reported, the first one's code kept") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  scaler.scale(at::ones({1}));
  scaler.submit([] { throw ScalerError(errc::invalid_gradients, "job 0 fails"); });
  scaler.submit([] { throw std::runtime_error("job 1 fails"); });
  scaler.submit([] {});
  scaler.submit([] { throw std::runtime_error("job 3 fails"); });
  scaler.finish_jobs();
  std::string text;
  errc code{};
  try {
    scaler.update();
    scaler.sync();
  } catch (const ScalerError& e) {
    text = e.what(), code = e.code();
  }
  CHECK(code == errc::invalid_gradients);
  CHECK(text.rfind("job 0 fails", 0) == 0);
  CHECK(text.find("also failed in this iteration: job 1 fails") != std::string::npos);
  CHECK(text.find("also failed in this iteration: job 3 fails") != std::string::npos);
  CHECK_NOTHROW(scaler.sync());  // reported once
  // At destruction, an open iteration's failures are all written to stderr.
  std::ostringstream err;
  std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
  {
    GradScaler last(opts(128, 2, 0.5, 1));
    last.scale(at::ones({1}));
    last.submit([] { throw std::runtime_error("first of the last"); });
    last.submit([] { throw std::runtime_error("second of the last"); });
  }
  std::cerr.rdbuf(old);
  CHECK(err.str().find("first of the last") != std::string::npos);
  CHECK(err.str().find("also failed in this iteration: second of the last") != std::string::npos);
}

TEST_CASE("update(new_scale) in an iteration whose job fails or is cancelled changes nothing") {
  SUBCASE("the job fails") {
    GradScaler scaler(opts(128, 2, 0.5, 1));
    scaler.scale(at::ones({1}));
    scaler.submit([] { throw std::runtime_error("job failed"); });
    std::string what;
    try {
      scaler.update(1024.0);
      scaler.sync();
    } catch (const ScalerError& e) {
      what = e.what();
    }
    CHECK(what == "job failed");
    scaler.sync();
    CHECK(scaler.get_scale() == 128.0);  // not 1024
  }
  SUBCASE("a job of the iteration is cancelled") {
    GradScaler scaler(opts(128, 2, 0.5, 1));
    scaler.scale(at::ones({1}));
    std::promise<void> started, go;
    std::shared_future<void> gate = go.get_future().share();
    scaler.submit([&started, gate] {  // holds the optimizer thread until released
      started.set_value();
      gate.wait_for(std::chrono::seconds(30));
    });
    bool ran = false;
    scaler.submit([&] { ran = true; });  // queued behind it
    REQUIRE(started.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    scaler.cancel();  // drops the second job only: the first is running
    scaler.update(1024.0);
    go.set_value();
    scaler.sync();  // a cancelled job is no error to rethrow
    CHECK(scaler.wait_result(0).cancelled_jobs == 1);
    CHECK_FALSE(ran);
    CHECK(scaler.get_scale() == 128.0);  // the iteration's update(1024) changed nothing
  }
}

TEST_CASE(
    "unscale_ of an optimizer without gradients records no inf check: update() raises "
    "torch's error and the scale and tracker stay") {
  // As torch: its unscale_ records no found_inf for an optimizer with no grads, so update()
  // finds none, on the main thread and inside a step job alike.
  for (bool in_job : {false, true}) {
    CAPTURE(in_job);
    GradScaler scaler(opts(128, 2, 0.5, 1));
    Net net;  // no grads
    scaler.scale(at::ones({1}));
    std::string what;
    try {
      if (in_job)
        scaler.submit([&] { scaler.unscale_(*net.opt); });
      else
        scaler.unscale_(*net.opt);
      scaler.update();
      scaler.sync();
    } catch (const ScalerError& e) {
      what = e.what();
    }
    CHECK(what == texts::no_inf_checks_before_update);
    scaler.sync();
    CHECK(scaler.get_scale() == 128.0);  // interval 1: a clean update would have doubled it
    CHECK(scaler.state_dict().get_int("_growth_tracker") == 0);
  }
}

TEST_CASE(
    "iteration() is the main thread's: refused inside a step job and on another thread, "
    "is_enabled() answers anywhere") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  scaler.scale(at::ones({1}));
  auto code = [](auto&& f) {
    try {
      f();
    } catch (const ScalerError& e) {
      return e.code();
    }
    return errc{};
  };
  errc in_job{}, elsewhere{};
  bool enabled_in_job = false;
  scaler.run_on_optimizer([&] {
    in_job = code([&] { scaler.iteration(); });
    enabled_in_job = scaler.is_enabled();
  });
  std::thread([&] { elsewhere = code([&] { scaler.iteration(); }); }).join();
  CHECK(in_job == errc::wrong_thread);
  CHECK(elsewhere == errc::wrong_thread);
  CHECK(enabled_in_job);
  CHECK(scaler.iteration() == 0);
}
