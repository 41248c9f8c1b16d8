// The stale schedule (staleness 1): step() waits for the last step's weights to reach the model
// (copied, or swapped in with swap_weights) and for this step's grad move, both in one job; the
// step itself runs behind the next forward/backward. With swap_weights the step's job then fills
// the spare weights, even when the step fails, as the copy of the next step would have been.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include "actors/internal/pipeline_job.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/schedule.h"

namespace ampactor::internal {

namespace {

class Stale : public Schedule {
 public:
  using Schedule::Schedule;

  void step(torch::optim::Optimizer& opt, std::function<void()> fn) override {
    if (deferred_) return deferred_->step(opt, std::move(fn));
    Placement& place = *p_.place;
    if (place.checks_only(opt)) {
      // A fused step that reads the grads would read them during the next backward: it takes
      // them, and from then on every step is a deferred one (one protocol for the spare). The
      // first waits for the waited steps' jobs, which may still be filling the spare.
      p_.scaler().run_on_optimizer([] {});
      deferred_ = deferred_schedule(p_);
      return deferred_->step(opt, std::move(fn));
    }
    const std::vector<at::Tensor> grads = p_.model_grads();
    const bool swap = p_.plan.swap;
    const Into into = swap && place.writes_weights(opt) ? Into::spare : Into::none;
    // FIFO: this also waits for the previous step, whose result it publishes to the model.
    p_.run_step([&] {
      if (swap)
        place.swap_in();
      else
        place.to_model();
      place.take(opt, grads, into, /*adopt=*/false);
    });
    if (!fn && !swap && !p_.options.clip_grad_norm()) return;
    p_.scaler().submit(
        [this, &opt, swap, fn = std::move(fn)] {
          try {
            p_.stepping(opt, fn);
          } catch (...) {
            if (swap) try {
                p_.place->fill_spare(/*written=*/false);
              } catch (...) {  // the group failed: the step's error is the one to report
              }
            throw;
          }
          if (swap) p_.place->fill_spare(PipelineJob(*JobContext::current()).wrote_weights(opt));
        },
        SubmitOptions().unscales(UnscalePermit::none()));
  }

  void sync() override {
    if (deferred_) return deferred_->sync();
    if (!p_.plan.swap) return Schedule::sync();
    p_.scaler().run_on_optimizer([&] {
      p_.place->swap_in();  // both buffers equal: the next step may swap again
      p_.place->fill_spare(/*written=*/false);
    });
  }

 private:
  std::unique_ptr<Schedule> deferred_;  // from the first step that takes the grads
};

}  // namespace

std::unique_ptr<Schedule> stale_schedule(Pipeline& p) {
  return std::make_unique<Stale>(p);
}

}  // namespace ampactor::internal
