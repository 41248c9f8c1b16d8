// The actor-backed GradScaler set up and driven other ways: state_dict, disabled scalers, the
// caller's actor system and a user's own trainer (split from test_grad_scaler_jobs.cpp).
#include "grad_scaler_fixture.h"

#include <future>

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
