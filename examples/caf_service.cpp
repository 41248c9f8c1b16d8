// ampactor inside a CAF service: a trainer actor of your own drives the iterations purely by
// messages (ScaleRequest -> StepJob -> UpdateScale + CloseIteration), never blocking, while a
// monitor actor asks the scale keeper's up-to-date state and changes a setting as training runs.
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/messages/config.h>
#include <ampactor/version.h>
#include <torch/torch.h>
#include <caf/all.hpp>

#include <iostream>

using namespace ampactor;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

namespace {

struct Trainer {
  torch::nn::Sequential model{torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 1)};
  std::shared_ptr<torch::optim::SGD> opt =
      std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05));
  at::Tensor x = torch::randn({128, 8}), y = x.sum(1, /*keepdim=*/true).cos();
  ScalerActors actors;
  caf::actor report_to;
  iteration_t k = 0, n = 0;
  int skipped = 0;
};

/// One iteration, by messages only: the scale for k, forward/backward with it, the step on the
/// optimizer actor, then k's update and close. The next forward starts once the step is done.
void iterate(caf::stateful_actor<Trainer>* self) {
  auto& st = self->state;
  if (st.k == st.n) {
    self->send(st.report_to, done_atom::value, st.skipped);
    return self->quit();
  }
  self->request(st.actors.keeper, caf::infinite, ScaleRequest{st.k}).then([=](const ScaleReply& r) {
    auto& s = self->state;
    s.opt->zero_grad();
    at::Tensor loss = torch::mse_loss(s.model->forward(s.x), s.y);
    if (r.k == 60) loss = loss * INFINITY;  // one overflow: its step is skipped
    (loss * r.scale).backward();
    auto opt = s.opt;
    StepJob job{r.k, r.scale, [opt] { JobContext::current()->step(*opt); }};
    self->request(s.actors.optimizer, caf::infinite, std::move(job)).then([=](const JobDone& d) {
      auto& s2 = self->state;
      self->send(s2.actors.keeper, UpdateScale{d.k, d.unscales});
      self->send(s2.actors.optimizer, CloseIteration{d.k, false});
      ++s2.k;
      iterate(self);
    });
  });
}

caf::behavior trainer(caf::stateful_actor<Trainer>* self, ScalerActors actors, iteration_t n,
                      caf::actor report_to) {
  self->state.actors = actors;
  self->state.n = n;
  self->state.report_to = report_to;
  // Each iteration's results arrive as messages too.
  self->send(actors.optimizer, subscribe_atom::value, caf::actor_cast<trainer_actor>(self));
  iterate(self);
  return {
      [=](const IterationDone& d) { self->state.skipped += d.skipped(); },
      [](const StepResult&) {},
      [](const UpdateApplied&) {},
  };
}

/// Every 50 ms: the keeper's up-to-date state; after the first look, a shorter growth interval.
caf::behavior monitor(caf::event_based_actor* self, scale_keeper_actor keeper) {
  self->send(self, tick_atom::value);
  auto looks = std::make_shared<int>(0);
  return {
      [=](tick_atom) {
        self->request(keeper, caf::infinite, GetParams{true}).then([=](const ScaleParams& p) {
          std::cout << "monitor: through iteration " << p.applied_through << ", scale " << p.scale
                    << ", growth interval " << p.growth_interval << "\n";
          if ((*looks)++ == 0)
            self->request(keeper, caf::infinite, SetGrowthInterval{20})
                .then([](const ScaleParams& q) {
                  std::cout << "monitor: growth interval set to " << q.growth_interval << "\n";
                });
        });
        self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
      },
  };
}

}  // namespace

int main() {
  torch::manual_seed(0);
  SystemConfig cfg;
  caf::actor_system sys{cfg};
  const ScalerActors actors =
      spawn_scaler_actors(sys, GradScalerOptions().init_scale(1024).growth_interval(1000));
  caf::scoped_actor self{sys};
  auto watch = sys.spawn(monitor, actors.keeper);
  sys.spawn(trainer, actors, iteration_t(200), caf::actor{self});
  int skipped = -1;
  self->receive([&](done_atom, int s) { skipped = s; },
                caf::after(std::chrono::seconds(60)) >>
                    [&] { std::cerr << "the trainer did not finish within 60 s\n"; });
  self->request(actors.keeper, std::chrono::seconds(10), GetParams{true})
      .receive(
          [&](const ScaleParams& p) {
            std::cout << "ampactor " << AMPACTOR_VERSION_STRING << ": 200 iterations, " << skipped
                      << " skipped, final scale " << p.scale << "\n";
          },
          [&](caf::error& e) {
            std::cerr << "GetParams: " << sys.render(e) << "\n";
            skipped = -1;
          });
  self->send_exit(watch, caf::exit_reason::user_shutdown);
  self->send_exit(actors.optimizer, caf::exit_reason::user_shutdown);
  self->send_exit(actors.keeper, caf::exit_reason::user_shutdown);
  return skipped == 1 ? 0 : 1;
}
