// The actor-backed GradScaler's jobs: draining and cancelling them, failed jobs and how they are
// reported, and the calls that are the main thread's (test_grad_scaler_setups.cpp: the rest).
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
