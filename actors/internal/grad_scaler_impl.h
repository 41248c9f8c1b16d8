// GradScaler's insides, split by what each part is for and who may touch it. Not installed.
#pragma once

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>

#include <caf/scoped_actor.hpp>

#include <atomic>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <thread>

namespace ampactor::internal {

/// Fixed at construction and read by both threads (the optimizer thread reads it inside jobs).
struct ScalerSetup {
  GradScalerOptions opts;
  ScalePolicy policy = ScalePolicy::exact;
  std::shared_ptr<KeeperTap> tap;
  bool raise_tap_failure = false;  // KeeperOptions::raise_tap_failure
  bool tap_failure_seen = false;   // the tap's failure was taken up (raised at most once)
  ScalerActors actors;
  std::thread::id owner = std::this_thread::get_id();
  /// Bumped by cancel(): jobs queued before it are dropped unrun.
  std::shared_ptr<std::atomic<std::uint64_t>> cancel_epoch =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  /// name_parameters(): read by the optimizer actor for its overflow reports.
  std::shared_ptr<ParameterNames> names = std::make_shared<ParameterNames>();
};

/// Closed iterations' results and the failures no call has reported yet. Main thread only.
class ResultLog {
 public:
  void store(IterationDone& d);
  std::optional<IterationResult> find(iteration_t k) const;
  iteration_t newest() const { return newest_; }
  /// The oldest failure not yet reported, taken out of the log.
  std::optional<IterationDone> take_unreported();
  const std::deque<IterationDone>& unreported() const { return unreported_; }
  /// The newest stored iteration whose unscale found inf or NaN and named the gradients.
  const std::optional<OverflowReport>& last_overflow() const { return last_overflow_; }

 private:
  std::optional<OverflowReport> last_overflow_;
  std::map<iteration_t, IterationDone> results_;
  iteration_t newest_ = -1;
  std::deque<IterationDone> unreported_;
};

/// Where the main thread stands in its iteration. Main thread only.
struct MainState {
  iteration_t k = 0;
  bool initialized = false;         // a ScaleRequest has been answered (torch: _scale exists)
  std::optional<float> scale_k;     // the scale of iteration k, once asked for
  ScaleGuard guard_k;               // the collapse guard's view of scale_k
  std::int32_t known_unscales = 0;  // UnscaleDone{k} sent by jobs the main thread waited for
  bool async_in_k = false;          // a job that may unscale was submitted in iteration k
  bool jobs_in_k = false;           // any job was submitted in iteration k
  // The exact policy's scale for iteration k is the keeper's scale once update k-1 is applied;
  // the lagged policy's is the newest applied one. The keeper pushes each (UpdateApplied), so
  // scale() costs no round trip of its own: a blocking request wakes the keeper's thread, which
  // on a machine whose cores the trainer and the optimizer keep busy waits for a time slice
  // (milliseconds). After a load_state_dict the pushed value is stale until the next update: ask.
  std::optional<UpdateApplied> applied;
  bool ask_for_scale = true;
  // A CloseIteration that needs no answer rides along with the next message to the optimizer
  // (one wake-up of its thread instead of two).
  std::optional<iteration_t> pending_close;
};

class SystemHolder;

/// CAF 0.17 keeps, per thread, a reference to the logger of the last actor system built (or
/// scoped actor made) on that thread, and an actor_system's destructor waits until every such
/// reference is gone: a system destroyed on another thread than those would wait for ever.
/// Called on the calling thread once its CAF objects are made, so a GradScaler (and its own
/// system) may be destroyed on any thread.
void release_thread_logger();

}  // namespace ampactor::internal

namespace ampactor {

struct GradScaler::Impl {
  Impl(caf::actor_system* sys, const GradScalerOptions& opts, const KeeperOptions& keeper);
  ~Impl();

  internal::ScalerSetup setup;
  internal::MainState main;
  internal::ResultLog log;
  std::unique_ptr<internal::SystemHolder> own;  // the actor system, when the scaler owns it
  // Told, after the last job, that the scaler is gone (GradScaler::on_gone).
  std::vector<std::pair<const void*, std::function<void()>>> on_gone;
  caf::actor_system* sys = nullptr;
  std::unique_ptr<caf::scoped_actor> self;  // the trainer: the main thread's actor

  const GradScalerOptions& opts() const { return setup.opts; }
  /// The job running on this thread, if it is one of this scaler's.
  JobContext* job() const;
  void require_main(const char* method) const;
  void require_update_thread() const;
  void require_initialized(const char* method) const;
  /// update()'s common start: the thread rule; disabled, it only closes the iteration (true:
  /// nothing more to do); enabled, the scale must exist.
  bool begin_update();
  float ensure_scale();
  template <class Res, class Req>
  Res ask_keeper(caf::scoped_actor& who, Req req);
  void flush_close();
  /// Runs fn as a job of iteration k and waits for it; a job error (not fn's) is thrown.
  JobDone run_job(std::function<void()> fn);
  /// Runs fn as a job and returns its value; an exception from fn is rethrown here as thrown
  /// (it does not fail the iteration).
  template <class F>
  auto run_and_rethrow(F fn) -> decltype(fn());
  std::uint64_t epoch() const { return setup.cancel_epoch->load(); }
  /// Every earlier job and close has run: its IterationDone messages are in our mailbox.
  void wait_for_optimizer() {
    run_job([] {});
  }
  /// Takes what the optimizer and keeper published, without waiting.
  void drain();
  void receive_one();
  void raise_unreported();
  /// Closes iteration k; `update` (if any) goes to the keeper first.
  void close_iteration(const std::optional<KeeperInput>& update);
  ScaleParams params(bool up_to_date, const char* method);
};

template <class Res, class Req>
Res GradScaler::Impl::ask_keeper(caf::scoped_actor& who, Req req) {
  Res out{};
  caf::error err;
  who->request(setup.actors.keeper, caf::infinite, std::move(req))
      .receive([&](Res& r) { out = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
  if (err) throw to_exception(err);
  return out;
}

template <class F>
auto GradScaler::Impl::run_and_rethrow(F fn) -> decltype(fn()) {
  using R = decltype(fn());
  std::exception_ptr ep;
  if constexpr (std::is_void_v<R>) {
    run_job([&] {
      try {
        fn();
      } catch (...) {
        ep = std::current_exception();
      }
    });
    if (ep) std::rethrow_exception(ep);
  } else {
    std::optional<R> out;
    run_job([&] {
      try {
        out.emplace(fn());
      } catch (...) {
        ep = std::current_exception();
      }
    });
    if (ep) std::rethrow_exception(ep);
    return std::move(*out);
  }
}

}  // namespace ampactor
