// The peers' update rules through the actor-backed GradScaler: the keeper applies the same rule
// as the thread-free scaler, and deepspeed's error at its minimum reaches the main thread.
#include "grad_scaler_fixture.h"
#include "refusal.h"

using ampactor::test::Refusal;
using ampactor::test::refusal_of;

TEST_CASE("peer rules, real threads: the GradScaler's trajectory equals the thread-free one") {
  struct Case {
    const char* name;
    GradScalerOptions o;
  };
  // Short intervals and a start near the workload's overflow threshold, so that every run both
  // grows and backs off; deepspeed without its error at the minimum (tested below).
  const Case cases[] = {
      {"deepspeed", GradScalerOptions::deepspeed().raise_at_min_scale(false).hysteresis(3)},
      {"megatron", GradScalerOptions::megatron()},
      {"apex", GradScalerOptions::apex().max_scale(65536)},
      {"colossalai", GradScalerOptions::colossalai()},
      {"keras", GradScalerOptions::keras()},
      {"tf", GradScalerOptions::tf()},
      {"jmp", GradScalerOptions::jmp().min_scale(4)},
  };
  const Workload w{3};
  const Trajectory torch = run_reference(opts(65536, 2, 0.5, 3), w, false);
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const GradScalerOptions o = GradScalerOptions(c.o).init_scale(65536).growth_interval(3);
    const Trajectory ref = run_reference(o, w, false);
    const Trajectory act = run_actors(o, w, false, Mode::submit);
    CHECK(act.scales == ref.scales);
    CHECK(act.skipped == ref.skipped);
    CHECK(act.final_scale == ref.final_scale);
    for (std::size_t i = 0; i < ref.params.size(); ++i)
      CHECK(act.params[i].equal(ref.params[i]));
    if (std::string(c.name) == "deepspeed" || std::string(c.name) == "megatron" ||
        std::string(c.name) == "colossalai")  // hysteresis: another trajectory than torch's
      CHECK(ref.scales != torch.scales);
  }
}

TEST_CASE("deepspeed at its minimum: the next scale() throws on the main thread, state intact") {
  // Every iteration overflows: 4 -> 2 -> 1 (the minimum), then the error.
  GradScaler scaler(GradScalerOptions::deepspeed().init_scale(4).hysteresis(1));
  Net net;
  auto overflow = [&] {
    scaler.submit([&] {
      net.set_grads({at::full({7}, INFINITY), at::zeros({5, 3})});
      scaler.step(*net.opt);
    });
    scaler.update();
  };
  for (float want : {4.0f, 2.0f, 1.0f}) {
    scaler.scale(at::ones({1}));
    CHECK(scaler.get_scale() == want);
    overflow();
  }
  const Refusal r = refusal_of([&] { scaler.scale(at::ones({1})); });
  CHECK(r.code == errc::scale_at_minimum);
  CHECK(r.what ==
        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
  CHECK(scaler.get_scale() == 1.0);  // nothing changed
  // and again, until the user acts
  CHECK(refusal_of([&] { scaler.scale(at::ones({1})); }).code == errc::scale_at_minimum);
  // A scale the user chooses resumes the run.
  scaler.update(8.0);
  CHECK(float(scaler.scale(at::ones({1})).item<float>()) == 8.0f);
}

TEST_CASE(
    "a hysteresis rule's tracker survives state_dict and load_state_dict through the actors") {
  const auto o = GradScalerOptions::megatron().init_scale(1024);
  auto overflow = [](GradScaler& scaler, Net& net) {
    scaler.scale(at::ones({1}));
    scaler.submit([&] {
      net.set_grads({at::full({7}, INFINITY), at::zeros({5, 3})});
      scaler.step(*net.opt);
    });
    scaler.update();
  };
  // Each scaler steps its own net: their optimizer threads run at once.
  GradScaler a(o);
  Net net_a, net_loaded, net_fresh;
  overflow(a, net_a);  // absorbed: the tracker goes 2 -> 1, the scale stays
  const StateDict sd = a.state_dict();
  CHECK(std::get<double>(sd.at("scale")) == 1024.0);
  CHECK(std::get<std::int64_t>(sd.at("_hysteresis_tracker")) == 1);
  GradScaler loaded(o), fresh(o);
  loaded.load_state_dict(sd);
  CHECK(loaded.state_dict() == sd);
  overflow(loaded, net_loaded);  // the second overflow of the run: backs off
  overflow(fresh, net_fresh);    // a first overflow: absorbed
  CHECK(loaded.get_scale() == 512.0);
  CHECK(fresh.get_scale() == 1024.0);
}

TEST_CASE(
    "raise_on_collapse: the next scale() throws scale_collapsed with its history, state intact") {
  // Every iteration overflows: 16 -> 8 -> 4, and the third backoff in a row is the collapse.
  GradScaler scaler(
      GradScalerOptions().init_scale(16).collapse_backoffs(3).collapse_below(0).raise_on_collapse(
          true));
  Net net;
  auto overflow = [&] {
    scaler.submit([&] {
      net.set_grads({at::full({7}, INFINITY), at::zeros({5, 3})});
      scaler.step(*net.opt);
    });
    scaler.update();
  };
  for (int i = 0; i < 3; ++i) {
    scaler.scale(at::ones({1}));
    overflow();
  }
  const Refusal r = refusal_of([&] { scaler.scale(at::ones({1})); });
  CHECK(r.code == errc::scale_collapsed);
  CHECK(r.what.find("backed off 3 times in a row (the last 3 backoffs: 16 -> 8 -> 4 -> 2)") !=
        std::string::npos);
  CHECK(scaler.get_scale() == 4.0);  // nothing changed
  scaler.update(64.0);               // a scale the user chooses resumes the run
  CHECK(float(scaler.scale(at::ones({1})).item<float>()) == 64.0f);
}

TEST_CASE("StepResult says whether the scale its step used had tripped the collapse guard") {
  // Overflows at iterations 0 to 2 take 16 to 2: the third backoff in a row trips the guard
  // (warn only), so iteration 3's step, at scale 2, is the one to say it; iteration 3 is clean,
  // so 4's scale follows no backoff.
  GradScaler scaler(GradScalerOptions().init_scale(16).collapse_backoffs(3).collapse_below(0));
  Net net;
  for (iteration_t k = 0; k < 5; ++k) {
    scaler.scale(at::ones({1}));
    scaler.submit([&, k] {
      net.set_grads({at::full({7}, k <= 2 ? INFINITY : 1.0f), at::zeros({5, 3})});
      scaler.step(*net.opt);
    });
    scaler.update();
  }
  scaler.sync();
  const std::int64_t in_row[] = {0, 1, 2, 3, 0};
  for (iteration_t k = 0; k < 5; ++k) {
    CAPTURE(k);
    const IterationResult r = scaler.wait_result(k);
    REQUIRE(r.steps.size() == 1);
    CHECK(r.steps[0].guard.backoffs_in_row == in_row[k]);
    CHECK(r.steps[0].guard.collapsing == (k == 3));
  }
}
