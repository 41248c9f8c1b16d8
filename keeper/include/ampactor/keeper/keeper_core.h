// The scale keeper's logic as a plain class: no actors, no threads, no tracing. Each input goes
// in with who sent it; out come, in order, the replies (now or, for a request that had to wait,
// later) and the pushes to subscribers. The keeper actor (<ampactor/actors/scale_keeper.h>) is a
// thin wrapper that maps peers to actor handles; replay drives the core directly.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <ampactor/core/arg.h>
#include <ampactor/core/options.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/keeper/protocol.h>

namespace ampactor {

/// Who sent an input or receives an output (the wrapper uses actor ids). 0: anonymous.
using peer_id = std::uint64_t;

/// peer -> keeper: push every UpdateApplied to `subscriber` (once, however often it subscribes).
struct Subscribe {
  peer_id subscriber = 0;
};
/// peer -> keeper: stop pushing to `subscriber` (nothing happens if it was not subscribed).
struct Unsubscribe {
  peer_id subscriber = 0;
};

/// Everything a keeper receives. The first five are requests: each gets exactly one reply.
using KeeperInput = std::variant<ScaleRequest, GetParams, SetGrowthFactor, SetBackoffFactor,
                                 SetGrowthInterval, GetStateDict, LoadStateDict,  // requests
                                 UnscaleDone, UpdateScale, UpdateWhenClosed, SetScale,
                                 IterationClosed, Subscribe, Unsubscribe>;

/// True for the inputs that get a reply.
bool is_request(const KeeperInput& in);
/// The iteration an input belongs to (-1 for monitor queries and subscriptions).
iteration_t iteration_of(const KeeperInput& in);

/// A refused request: the error the requester gets.
struct KeeperError {
  errc code = errc::protocol_misuse;
  std::string what;
};

using ReplyMessage = std::variant<ScaleReply, ScaleParams, StateDictMsg, KeeperError>;

/// keeper -> one requester.
struct KeeperReply {
  peer_id to = 0;
  /// The token the request came in with (the wrapper's handle on its response promise).
  std::uint64_t request = 0;
  iteration_t k = -1;  // the request's iteration (-1 for monitor queries)
  ReplyMessage msg;
};

/// keeper -> every subscriber in `to`, in subscription order.
struct KeeperPush {
  std::vector<peer_id> to;
  UpdateApplied msg;
};

using KeeperOutput = std::variant<KeeperReply, KeeperPush>;

/// Sees every input before the core acts on it and every output as it is made, on the keeper's
/// thread, one call at a time. Tracing is one such observer. A tap that throws is dropped (with
/// a line on stderr) and the keeper goes on.
class KeeperTap {
 public:
  virtual ~KeeperTap() = default;
  /// Once, when the core is built, before any input.
  virtual void started(const GradScalerOptions& opts, ScalePolicy policy) = 0;
  virtual void input(peer_id from, const KeeperInput& in) = 0;
  virtual void output(const KeeperOutput& out) = 0;
  /// Once, when the keeper stops (its actor exits): nothing more will come.
  virtual void stopped() {}
  /// Why the tap records no more (a trace write failed), or "" while it records. Any thread.
  virtual std::string failure() const { return {}; }
};

/// How a keeper runs, for spawn_scale_keeper and GradScaler:
/// KeeperOptions().policy(ScalePolicy::lagged).tap(ampactor::record_trace("run.jsonl")).
class KeeperOptions {
  /// exact: a ScaleRequest waits for the updates sent before it; lagged: it is answered at once.
  AMPACTOR_ARG_ANY(ScalePolicy, policy, ScalePolicy::exact);
  /// A thread of its own (the default): the keeper answers without waiting for one of CAF's
  /// work-stealing workers, which poll with sleeps (bench/ has the round trips of both). Tests
  /// under CAF's deterministic scheduler turn this off.
  AMPACTOR_ARG_ANY(bool, detached, true);
  /// Sees every input and output in mailbox order (e.g. a trace recorder,
  /// <ampactor/trace/trace.h>); told started() before spawn_scale_keeper returns and stopped()
  /// when the keeper exits.
  AMPACTOR_ARG_ANY(std::shared_ptr<KeeperTap>, tap, nullptr);
  /// A tap that fails (a trace that cannot be written: a full disk, a file size limit) is said
  /// once on stderr and by GradScaler::tap_failure(); true: the GradScaler call after the failure
  /// also throws ScalerError(errc::bad_trace) with the reason, once (the training may go on).
  AMPACTOR_ARG_ANY(bool, raise_tap_failure, false);
};

class KeeperCore {
 public:
  /// Checks `opts` (ScalerError on bad options).
  KeeperCore(const GradScalerOptions& opts, ScalePolicy policy,
             std::shared_ptr<KeeperTap> tap = nullptr);
  ~KeeperCore();
  KeeperCore(const KeeperCore&) = delete;
  KeeperCore& operator=(const KeeperCore&) = delete;

  /// Acts on one input from `from`; `request` is the token its reply will carry. Returns what to
  /// send, in order: this input's reply if it can be answered now, replies to earlier requests it
  /// released, and pushes. Never throws for bad input: a refused request is a KeeperError reply.
  std::vector<KeeperOutput> handle(peer_id from, const KeeperInput& in, std::uint64_t request = 0);

  /// Tells the tap that nothing more comes (idempotent).
  void stop();

  ScalePolicy policy() const { return policy_; }
  const ScaleState& state() const { return state_; }
  ScaleParams params() const;
  const std::vector<peer_id>& subscribers() const { return subscribers_; }
  /// Requests and updates waiting (for unscale reports, or behind an update that waits).
  std::size_t waiting() const { return queue_.size(); }

 private:
  /// What has arrived for one iteration from the optimizer side.
  struct Unscales {
    std::int32_t count = 0;
    bool found_inf = false;
    /// The smallest scale_used among reports with found_inf (lagged policy: if it is larger
    /// than the current scale, and not above top_since_set_, that overflow event was already
    /// backed off).
    float min_inf_scale = std::numeric_limits<float>::infinity();
  };
  struct Queued {
    peer_id from = 0;
    std::uint64_t request = 0;
    KeeperInput in;
  };

  void on(peer_id from, std::uint64_t request, const ScaleRequest& r);
  void on(peer_id from, std::uint64_t request, const GetParams& g);
  void on(const UnscaleDone& d);
  void on(const IterationClosed& c);
  void note_update(iteration_t k);
  bool ready(const KeeperInput& update) const;
  void apply(const KeeperInput& update);
  void answer(const Queued& q);
  void drain();
  void reply(peer_id to, std::uint64_t request, iteration_t k, ReplyMessage msg);
  /// The collapse guard's view of the current scale.
  ScaleGuard guard() const;
  /// The answer to ScaleRequest{k}: the scale, or the error of a halted keeper.
  ReplyMessage scale_answer(iteration_t k) const;
  void emit(KeeperOutput out);
  template <class F>
  void notify(F f);

  ScaleState state_;
  ScalePolicy policy_;
  /// Set when an update raised (the deepspeed rule at its minimum): scale requests get it.
  std::optional<KeeperError> halted_;
  iteration_t applied_through_ = -1;
  /// The largest scale since the last update(new_scale) or load (infinity before one): under
  /// lagged, only an overflow made at a scale from then on can have been answered by a backoff.
  float top_since_set_ = std::numeric_limits<float>::infinity();
  std::map<iteration_t, Unscales> unscales_;
  /// What the optimizer said of iterations it closed.
  std::map<iteration_t, IterationClosed> closed_;
  std::deque<Queued> queue_;
  std::vector<peer_id> subscribers_;
  /// The exact policy's check: the first iteration requested, and the first one from there whose
  /// update has not been sent (updates arrive in mailbox order, before the next request).
  bool started_ = false;
  iteration_t first_missing_update_ = 0;
  std::shared_ptr<KeeperTap> tap_;
  bool stopped_ = false;
  std::vector<KeeperOutput>* out_ = nullptr;
};

}  // namespace ampactor
