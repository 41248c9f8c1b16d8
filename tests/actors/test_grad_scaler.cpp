// The actor-backed GradScaler: trajectories against torch, misuse, thread rules, job errors.
#include "grad_scaler_fixture.h"

// The reference is LocalGradScaler, whose trajectories the core suites check against torch's own.
TEST_CASE(
    "exact policy, real threads: the trajectory and parameters equal LocalGradScaler's, bit for "
    "bit") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    for (bool adam : {false, true}) {
      for (Mode mode : {Mode::main_step, Mode::submit}) {
        CAPTURE(seed);
        CAPTURE(adam);
        CAPTURE(int(mode));
        Workload w{seed};
        GradScalerOptions o = opts(65536, 2, 0.5, 3);
        Trajectory ref = run_reference(o, w, adam);
        Trajectory act = run_actors(o, w, adam, mode);
        int skips = 0;
        for (bool s : ref.skipped)
          skips += s;
        CHECK(skips > 10);  // the workload does overflow
        CHECK(skips < kIters / 2);
        CHECK(act.scales == ref.scales);
        CHECK(act.skipped == ref.skipped);
        CHECK(act.final_scale == ref.final_scale);
        for (std::size_t i = 0; i < ref.params.size(); ++i)
          CHECK(act.params[i].equal(ref.params[i]));
      }
    }
  }
}

TEST_CASE("lagged policy, real threads: every iteration accounted for, one backoff per event") {
  GradScaler scaler(opts(65536, 2, 0.5, 1000000), KeeperOptions().policy(ScalePolicy::lagged));
  Net net;
  Workload w{7, 0.0};
  int backoffs = 0;
  double last = 0;
  for (iteration_t k = 0; k < 200; ++k) {
    scaler.scale(at::ones({1}));
    const float s = float(scaler.get_scale());
    auto g = w.grads(k, s);
    scaler.submit([&net, &scaler, g] {
      net.set_grads(g);
      scaler.step(*net.opt);
    });
    scaler.update();
  }
  scaler.sync();
  // The keeper applies the updates in iteration order; an overflow found with a scale larger
  // than the current one was produced before the backoff that answered its event (the lag).
  // Replay that rule over the results: each event backs off once, stale overflows never.
  int skipped = 0, events = 0, stale = 0;
  double cur = 65536;
  for (iteration_t k = 0; k < 200; ++k) {
    auto r = scaler.wait_result(k);
    REQUIRE(r.steps.size() == 1);
    if (!r.steps[0].skipped) continue;
    ++skipped;
    if (double(r.steps[0].scale_used) > cur) {
      ++stale;
    } else {
      ++events;
      cur *= 0.5;
    }
  }
  last = scaler.get_scale();
  // No growth (huge interval): each backoff halves.
  backoffs = int(std::lround(std::log2(65536.0 / last)));
  MESSAGE(skipped << " skipped steps: " << events << " overflow events, " << stale
                  << " stale overflows of an event already backed off");
  CHECK(events >= 1);
  CHECK(backoffs == events);
  CHECK(last == cur);
  CHECK(skipped == events + stale);
}

TEST_CASE(
    "get_scale: the main thread's iteration versus the job's own scale, update(new_scale) "
    "after a job applies once the job has ended") {
  GradScaler scaler(opts(1024, 2, 0.5, 1));
  Net net;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<double> seen_in_job{0};
  scaler.scale(at::ones({1}));
  CHECK(scaler.get_scale() == 1024.0);
  net.set_grads({at::ones({7}), at::ones({5, 3})});
  scaler.submit([&] {
    gate.wait_for(std::chrono::seconds(30));
    seen_in_job = scaler.get_scale();
    scaler.step(*net.opt);
  });
  scaler.update(4096.0);  // returns at once; applied once the job has ended (it might fail)
  release.set_value();
  CHECK(scaler.get_scale() == 4096.0);  // main thread: iteration 1's scale
  scaler.sync();
  CHECK(seen_in_job.load() == 1024.0);  // the job: the scale its gradients were made with
}

TEST_CASE("submit with counted unscales: update applies on the job's unscale, not its end") {
  GradScaler scaler(opts(128, 2, 0.5, 1));  // each clean update doubles the scale
  Net net;
  // A count below 1 cannot be made; an empty job is refused as the guide says: ScalerError.
  auto code = [](auto&& fn) {
    try {
      fn();
    } catch (const ScalerError& e) {
      return e.code();
    }
    return errc{};
  };
  CHECK(code([] { UnscalePermit::exactly(0); }) == errc::bad_option);
  CHECK(code([] { UnscalePermit::exactly(-1); }) == errc::bad_option);
  CHECK(code([&] { scaler.submit(nullptr); }) == errc::bad_option);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  scaler.scale(at::ones({1}));
  net.set_grads({at::ones({7}), at::ones({5, 3})});
  scaler.submit(
      [&] {
        scaler.unscale_(*net.opt);  // the counted unscale
        gate.wait_for(
            std::chrono::seconds(30));  // the rest of the job (the optimizer math) still runs
        scaler.step(*net.opt);
      },
      SubmitOptions().unscales(UnscalePermit::exactly(1)));
  scaler.update();
  // Exact policy: iteration 1's scale is update 0's result, which came from the unscale alone.
  scaler.scale(at::ones({1}));
  CHECK(scaler.get_scale() == 256.0);
  release.set_value();
  scaler.update(256.0);
  scaler.sync();
  CHECK(scaler.wait_result(0).steps.size() == 1);
  CHECK_FALSE(scaler.wait_result(0).failed);

  // A counted job cancelled before it ran: the update it was counted for changes nothing, and
  // nothing waits for the unscale that never comes.
  std::promise<void> release2;
  std::shared_future<void> gate2 = release2.get_future().share();
  std::promise<void> started;
  scaler.scale(at::ones({1}));
  scaler.submit(
      [&] {
        started.set_value();
        gate2.wait_for(std::chrono::seconds(30));
      },
      SubmitOptions().unscales(UnscalePermit::none()));  // update() knows the count: the
                                                         // counted job's one unscale
  scaler.submit([&] { scaler.step(*net.opt); },
                SubmitOptions().unscales(UnscalePermit::exactly(1)));
  scaler.update();
  REQUIRE(started.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  scaler.cancel();
  release2.set_value();
  scaler.sync();
  CHECK(scaler.wait_result(2).cancelled_jobs == 1);
  CHECK(scaler.get_scale() == 256.0);
}

TEST_CASE("misuse on the main thread: torch's texts, nothing changes") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  Net net;
  auto text = [](auto&& fn) {
    try {
      fn();
    } catch (const ScalerError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  net.set_grads({at::ones({7}), at::ones({5, 3})});
  CHECK(text([&] { scaler.step(*net.opt); }) == scale_not_initialized_text("step"));
  CHECK(text([&] { scaler.unscale_(*net.opt); }) == scale_not_initialized_text("unscale_"));
  CHECK(text([&] { scaler.update(); }) == scale_not_initialized_text("update"));
  CHECK(text([&] { scaler.scale(at::Tensor()); }) == texts::bad_outputs);
  CHECK(text([&] {
          scaler.scale(std::vector<at::Tensor>{at::ones({1}), at::Tensor()});
        }) == texts::bad_outputs);
  CHECK(scaler.scale(at::ones({2}))[1].item<float>() == 128.0f);
  CHECK(text([&] { scaler.update(); }) == texts::no_inf_checks_before_update);
  CHECK(text([&] { scaler.step(*net.opt, [] { return at::ones({}); }); }) ==
        texts::closure_unsupported);
  scaler.unscale_(*net.opt);
  CHECK(net.params[0].grad()[0].item<float>() == 1.0f / 128.0f);
  CHECK(text([&] { scaler.unscale_(*net.opt); }) == texts::unscale_twice);
  CHECK(net.params[0].grad()[0].item<float>() == 1.0f / 128.0f);  // not unscaled twice
  scaler.step(*net.opt);
  CHECK(text([&] { scaler.unscale_(*net.opt); }) == texts::unscale_after_step);
  CHECK(text([&] { scaler.step(*net.opt); }) == texts::step_twice);
  CHECK(scaler.found_inf(*net.opt) == std::optional<bool>(false));
  CHECK(text([&] { scaler.update(-1.0); }).rfind("new_scale must be finite", 0) == 0);
  CHECK(text([&] { scaler.update(at::ones({2})); }) == texts::bad_new_scale);
  CHECK(text([&] { scaler.set_growth_factor(1.0); }).rfind(texts::growth_factor, 0) == 0);
  CHECK(text([&] { scaler.set_backoff_factor(1.0); }).rfind(texts::backoff_factor, 0) == 0);
  CHECK(text([&] { scaler.set_growth_interval(0); }) ==
        "The growth interval must be >= 1 and < 2^31. Got 0.");
  CHECK(text([&] { scaler.load_state_dict(StateDict{}); }) == texts::empty_state_dict);
  CHECK(text([&] { scaler.wait_result(0); }).find("not closed yet") != std::string::npos);
  CHECK(scaler.get_growth_factor(true) == 2.0);
  CHECK(scaler.get_backoff_factor(true) == 0.5);
  CHECK(scaler.get_growth_interval(true) == 1);
  scaler.update();
  CHECK(scaler.get_scale() == 256.0);  // one clean update after all those refusals

  // fp16 grads are refused before anything is unscaled.
  scaler.scale(at::ones({1}));
  net.set_grads({at::ones({7}).to(at::kHalf), at::ones({5, 3})});
  net.params[0].mutable_grad() = at::ones({7}, at::kHalf);
  CHECK(text([&] { scaler.step(*net.opt); }) == texts::fp16_grads);
  CHECK(net.params[1].grad()[0][0].item<float>() == 1.0f);
  CHECK(scaler.found_inf(*net.opt) == std::nullopt);
}

TEST_CASE("thread rules: update only from the main thread, main-only calls refused in jobs") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  Net net;
  scaler.scale(at::ones({1}));
  std::string from_thread, scale_from_thread;
  std::thread([&] {
    try {
      scaler.update();
    } catch (const ScalerError& e) {
      from_thread = e.what();
    }
    try {
      scaler.scale(at::ones({1}));
    } catch (const ScalerError& e) {
      scale_from_thread = to_string(e.code());
    }
  }).join();
  CHECK(from_thread == texts::update_off_main_thread);
  CHECK(scale_from_thread == "wrong_thread");

  std::vector<std::string> in_job;
  net.set_grads({at::ones({7}), at::ones({5, 3})});
  scaler.submit([&] {
    auto code = [&](auto&& fn) {
      try {
        fn();
      } catch (const ScalerError& e) {
        in_job.push_back(to_string(e.code()));
        return;
      }
      in_job.push_back("ok");
    };
    code([&] { scaler.update(); });
    code([&] { scaler.state_dict(); });
    code([&] { scaler.get_growth_factor(true); });
    code([&] { scaler.get_growth_factor(false); });
    code([&] { scaler.set_growth_factor(3.0); });
    code([&] { scaler.sync(); });
    code([&] { scaler.step(*net.opt); });
  });
  scaler.update();
  scaler.sync();
  CHECK(in_job == std::vector<std::string>{"update_off_main_thread", "wrong_thread", "wrong_thread",
                                           "ok", "wrong_thread", "wrong_thread", "ok"});
  CHECK(scaler.get_scale() == 256.0);
}

TEST_CASE("a job's exception is rethrown on the main thread, its iteration's update is dropped") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  Net net;
  for (iteration_t k = 0; k < 3; ++k) {
    scaler.scale(at::ones({1}));
    net.set_grads({at::ones({7}), at::ones({5, 3})});
    scaler.submit([&, k] {
      scaler.step(*net.opt);
      if (k == 1) throw std::runtime_error("loss exploded in the step function");
    });
    if (k == 1) {
      CHECK(scaler.get_scale() == 256.0);
    }
    if (k != 1) scaler.update();
    if (k == 1) {
      // update() reports it if the job has already failed, else sync() does; with its message.
      std::string what;
      try {
        scaler.update();
        scaler.sync();
      } catch (const ScalerError& e) {
        what = e.what();
        CHECK(e.code() == errc::step_failed);
      }
      CHECK(scaler.iteration() == 2);  // update() did its work either way
      CHECK(what == "loss exploded in the step function");
      scaler.sync();                       // reported once
      CHECK(scaler.get_scale() == 256.0);  // iteration 1 did not grow the scale
      CHECK(scaler.wait_result(1).failed);
    }
  }
  scaler.sync();
  CHECK(scaler.get_scale() == 512.0);  // iterations 0 and 2 grew it, once each
  CHECK_FALSE(scaler.wait_result(2).failed);

  // An exception from optimizer.step() called from the main thread keeps its type.
  ThrowingSGD bad(net.params, torch::optim::SGDOptions(0.1));
  scaler.scale(at::ones({1}));
  CHECK_THROWS_AS(scaler.step(bad), std::logic_error);
  scaler.update();  // the inf checks were recorded before step() threw, as in torch
  scaler.sync();
  CHECK(scaler.get_scale() == 1024.0);
}

TEST_CASE("a failing job is rethrown by the next step() before it acts") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  Net net;
  scaler.scale(at::ones({1}));
  net.set_grads({at::ones({7}), at::ones({5, 3})});
  std::promise<void> release;
  auto gate = release.get_future().share();
  scaler.submit([gate] {
    gate.wait_for(std::chrono::seconds(30));  // fail only after update() has returned
    throw std::runtime_error("first");
  });
  scaler.update();
  release.set_value();
  scaler.scale(at::ones({1}));
  // Wait until the optimizer has closed iteration 0, without consuming its error; 10 s at most.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!scaler.poll_result(0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE_MESSAGE(scaler.poll_result(0), "iteration 0 was not closed within 10 s");
  CHECK_THROWS_WITH(scaler.step(*net.opt), "first");
  CHECK(scaler.found_inf(*net.opt) == std::nullopt);  // the step did not run
  scaler.step(*net.opt);
  scaler.update();
  scaler.sync();
}

TEST_CASE("update() after jobs that never unscaled: torch's error, at sync") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  scaler.scale(at::ones({1}));
  scaler.submit([] {});
  std::string what;
  try {
    scaler.update();  // reports it if the job is already done
    scaler.sync();
  } catch (const ScalerError& e) {
    what = e.what();
  }
  CHECK(what == texts::no_inf_checks_before_update);
  scaler.sync();  // reported once
  CHECK(scaler.get_scale() == 128.0);
}

TEST_CASE("results: polled without waiting, awaited, and delivered to subscribers") {
  GradScaler scaler(opts(128, 2, 0.5, 1));
  Net net;
  caf::scoped_actor subscriber{
      caf::actor_cast<caf::actor>(scaler.actors().optimizer).home_system()};
  subscribe(scaler.actors(), caf::actor_cast<trainer_actor>(subscriber));
  scaler.scale(at::ones({1}));
  net.set_grads({at::ones({7}), at::full({5, 3}, INFINITY)});
  std::promise<void> release;
  auto gate = release.get_future().share();
  scaler.submit([&] {
    gate.wait_for(std::chrono::seconds(30));
    scaler.step(*net.opt);
  });
  scaler.update();
  CHECK_FALSE(scaler.poll_result(0));  // still running: no wait, no answer
  release.set_value();
  IterationResult r = scaler.wait_result(0);
  CHECK(r.k == 0);
  REQUIRE(r.steps.size() == 1);
  CHECK(r.steps[0].skipped);
  CHECK(r.steps[0].optimizer == optimizer_id_of(*net.opt));
  CHECK(r.skipped());
  CHECK(scaler.poll_result(0));
  CHECK(scaler.get_scale() == 64.0);
  // The subscriber got the step as it happened, then the iteration, and nothing else.
  std::vector<StepResult> steps;
  std::vector<IterationDone> done;
  bool timed_out = false;
  while (done.empty() && !timed_out)
    subscriber->receive([&](const StepResult& s) { steps.push_back(s); },
                        [&](const IterationDone& d) { done.push_back(d); },
                        [&](const UpdateApplied&) {},
                        caf::after(std::chrono::seconds(10)) >> [&] { timed_out = true; });
  REQUIRE_FALSE(timed_out);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].k == 0);
  CHECK(steps[0].skipped);
  CHECK(steps[0].optimizer == optimizer_id_of(*net.opt));
  REQUIRE(done.size() == 1);
  CHECK(done[0].k == 0);
  CHECK(done[0].skipped());
  CHECK_FALSE(done[0].failed);
  unsubscribe(scaler.actors(), caf::actor_cast<trainer_actor>(subscriber));
}
