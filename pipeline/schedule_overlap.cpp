// The overlapped-backward schedule (overlap_backward, staleness 0): the buckets were stepped
// speculatively during backward; step() commits them (or drops everything if any gradient
// overflowed) in one waited job. With the scaler disabled nothing was speculated: the
// synchronous step (or the offload's) runs instead.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/optim/fused.h>
#include "internal/host_offload.h"
#include "internal/overlap_backward.h"
#include "internal/pipeline.h"
#include "internal/schedule.h"

namespace ampactor::internal {

namespace {

class Overlapped : public Schedule {
 public:
  explicit Overlapped(Pipeline& p)
      : Schedule(p), plain_(p.offload ? offload_schedule(p) : synchronous_schedule(p)) {}

  void step(torch::optim::Optimizer& opt, std::function<void()> fn) override {
    OverlapBackward& o = *p_.overlap;
    // Whatever happens, the next backward starts a new iteration.
    struct Reset {
      OverlapBackward& o;
      ~Reset() { o.reset_iteration(); }
    } reset{o};
    o.use(opt, p_.masters);
    if (o.poisoned()) {
      p_.scaler().run_on_optimizer([&] { optim::fused_step_of(opt)->drop_speculation(); });
      throw ScalerError(errc::protocol_misuse,
                        "AsyncOptimizer::step (overlap_backward): a gradient was final twice in "
                        "this iteration (see the error its backward raised); nothing of it is "
                        "committed");
    }
    if (!p_.scaler().is_enabled()) return plain_->step(opt, std::move(fn));
    const std::vector<at::Tensor> grads = p_.model_grads();
    const iteration_t k = p_.scaler().iteration();
    auto commit = [&](const std::vector<at::Tensor>& g) {
      const auto t0 = std::chrono::steady_clock::now();
      const double norm = o.finish(opt, g, fn);
      if (p_.options.clip_grad_norm()) p_.grad_norm = norm;
      // The buckets' speculated steps ran during backward: this is the commit's time.
      if (p_.options.tap())
        p_.report_optimizer(
            k, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
    if (!p_.offload) return p_.run_step([&] { commit(grads); });
    // The grads no bucket sent (no hook fired, or the scale was not known yet) follow now; the
    // committed weights go back on the copy-in stream.
    p_.offload->exchange(&grads, nullptr, &o.sent());
    p_.run_step([&] { commit(p_.offload->receive_grads()); });
    p_.offload->exchange(nullptr, &p_.model);
  }

  void sync() override { plain_->sync(); }

 private:
  std::unique_ptr<Schedule> plain_;  // the scaler disabled
};

}  // namespace

std::unique_ptr<Schedule> overlapped_schedule(Pipeline& p) {
  return std::make_unique<Overlapped>(p);
}

}  // namespace ampactor::internal
