#include <ampactor/trace/rig.h>

namespace ampactor {

KeeperRig::KeeperRig(const TraceHeader& header)
    : core_(std::make_unique<KeeperCore>(header.opts, header.policy,
                                         std::make_shared<TraceRecorder>(buffer_))) {}

peer_id KeeperRig::peer(const std::string& name) {
  if (name == trace_anonymous) return 0;
  return peers_.try_emplace(name, peers_.size() + 1).first->second;
}

const std::vector<ReplyMessage>& KeeperRig::replies(const std::string& name) {
  return replies_[peer(name)];
}

std::vector<KeeperOutput> KeeperRig::send(const std::string& from, const KeeperInput& in) {
  auto outs = core_->handle(peer(from), in, next_request_++);
  for (const auto& o : outs) {
    if (const auto* r = std::get_if<KeeperReply>(&o))
      replies_[r->to].push_back(r->msg);
    else
      pushes_.push_back(std::get<KeeperPush>(o).msg);
  }
  return outs;
}

bool KeeperRig::send(const TraceEvent& e) {
  return std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, TraceSubscribe>) {
          send(e.from, Subscribe{peer(m.subscriber)});
          return true;
        } else if constexpr (std::is_same_v<T, TraceUnsubscribe>) {
          send(e.from, Unsubscribe{peer(m.subscriber)});
          return true;
        } else if constexpr (std::is_constructible_v<KeeperInput, T>) {
          send(e.from, KeeperInput{m});
          return true;
        } else {
          return false;
        }
      },
      e.msg);
}

}  // namespace ampactor
