// The deferred schedule (staleness 1 with defer_grad_move, or a fused step that reads the grads
// itself): step() takes the model's gradients away (the next backward allocates fresh ones) and
// the grad move runs in the step's job, behind the next forward. The trainer waits only for the
// last step's weights; with swap_weights the job that filled the spare says so in a message, so
// the swap costs no round trip to the optimizer thread, and none at all when the job ended during
// the forward/backward.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include "actors/internal/pipeline_job.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/schedule.h"

#include <caf/atom.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

namespace ampactor::internal {

namespace {

using spare_atom = caf::atom_constant<caf::atom("spare")>;

/// Tells the trainer's mailbox, once, whether a job filled the spare weights. A job dropped
/// unrun (cancel) says "not filled" when its closure is destroyed, so nobody waits forever.
struct SpareNotice {
  explicit SpareNotice(caf::actor who) : to(std::move(who)) {}
  SpareNotice(const SpareNotice&) = delete;
  SpareNotice& operator=(const SpareNotice&) = delete;
  ~SpareNotice() { send(/*filled=*/false); }
  void send(bool filled) {
    if (sent) return;
    sent = true;
    caf::anon_send(to, spare_atom::value, filled);
  }
  caf::actor to;
  bool sent = false;
};

class Deferred : public Schedule {
 public:
  using Schedule::Schedule;

  void step(torch::optim::Optimizer& opt, std::function<void()> fn) override {
    std::vector<at::Tensor> grads = p_.model_grads();
    // The job owns the grads from here: the next backward writes fresh ones, never these.
    for (at::Tensor& p : p_.model)
      p.mutable_grad() = at::Tensor();
    // The previous job's weights become the model's before the next forward.
    const bool swap = p_.plan.swap;
    if (swap)
      take_spare();
    else
      p_.run_step([&] { p_.place->to_model(); });  // FIFO: after the previous job
    std::shared_ptr<SpareNotice> notice;
    if (swap) {
      notice = std::make_shared<SpareNotice>(caf::actor{*p_.waiter});
      p_.spare_pending = true;  // exactly one word comes, even if submit() throws
    }
    // The move, then fn, not waited for. The trainer counts the move's unscale now, so under the
    // exact policy the next scale() waits for the move's inf check only, never for fn.
    p_.scaler().submit(
        [this, &opt, grads = std::move(grads), fn = std::move(fn), notice = std::move(notice)] {
          // The spare is filled even when the move or fn fails. The grads are the job's alone:
          // fp32 ones become the masters' grads without a copy.
          Placement& place = *p_.place;
          try {
            place.take(opt, grads, notice ? Into::spare : Into::none, /*adopt=*/true);
            p_.stepping(opt, fn);
          } catch (...) {
            if (notice) {
              try {
                place.fill_spare(/*written=*/false);
              } catch (...) {  // the group failed: the step's error is the one to report
              }
              notice->send(/*filled=*/true);
            }
            throw;
          }
          if (!notice) return;
          place.fill_spare(PipelineJob(*JobContext::current()).wrote_weights(opt));
          notice->send(/*filled=*/true);
        },
        SubmitOptions().unscales(UnscalePermit::exactly(1)));
  }

  void sync() override {
    if (!p_.plan.swap) return Schedule::sync();
    take_spare();  // the newest weights are the model's
    p_.scaler().run_on_optimizer([&] { p_.place->fill_spare(/*written=*/false); });  // both equal
  }

 private:
  /// Waits for the last job's word that the spare is filled, then swaps it in (or, if the job
  /// was dropped unrun, copies the masters).
  void take_spare() {
    bool filled = true;  // no job pending: the spare already holds the masters' weights
    if (p_.spare_pending) {
      (*p_.waiter)->receive([&](spare_atom, bool f) { filled = f; });
      p_.spare_pending = false;
    }
    if (filled) return p_.place->swap_in();
    p_.scaler().run_on_optimizer([&] {  // the job was dropped unrun: the masters as they are
      p_.place->to_model();
      p_.place->fill_spare(/*written=*/false);
    });
  }
};

}  // namespace

std::unique_ptr<Schedule> deferred_schedule(Pipeline& p) {
  return std::make_unique<Deferred>(p);
}

}  // namespace ampactor::internal
