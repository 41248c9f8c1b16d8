// A keeper core driven by hand, one input at a time, by peers named as a trace names them, and
// recording what it does. Deterministic by construction (no actors, no threads): replay, what-if
// and the tests of the keeper's logic all drive the keeper through it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ampactor/keeper/keeper_core.h>
#include <ampactor/trace/trace.h>

namespace ampactor {

class KeeperRig {
 public:
  /// A fresh keeper core with the header's options and policy (ScalerError if they are bad).
  explicit KeeperRig(const TraceHeader& header);
  KeeperRig(const GradScalerOptions& opts, ScalePolicy policy)
      : KeeperRig(TraceHeader{opts, policy}) {}

  /// Sends `in` as the peer called `from` ("anonymous": no sender) and returns what the core
  /// sent, in order. Replies are also kept per receiver (replies()).
  std::vector<KeeperOutput> send(const std::string& from, const KeeperInput& in);
  /// Sends a trace's input event as it was recorded (false: the event is not an input).
  bool send(const TraceEvent& e);

  /// The peer standing for a name (made at first use; "anonymous" is 0).
  peer_id peer(const std::string& name);
  /// Every reply `name` has received so far, oldest first.
  const std::vector<ReplyMessage>& replies(const std::string& name);
  /// Every UpdateApplied pushed so far, oldest first.
  const std::vector<UpdateApplied>& pushes() const { return pushes_; }
  /// The trace of everything so far (the recorder's names, as in a recorded trace).
  const std::vector<TraceEvent>& events() const { return buffer_->events; }
  KeeperCore& core() { return *core_; }

 private:
  std::shared_ptr<TraceBuffer> buffer_ = std::make_shared<TraceBuffer>();
  std::unique_ptr<KeeperCore> core_;
  std::map<std::string, peer_id> peers_;
  std::map<peer_id, std::vector<ReplyMessage>> replies_;
  std::vector<UpdateApplied> pushes_;
  std::uint64_t next_request_ = 1;
};

}  // namespace ampactor
