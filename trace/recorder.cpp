// TraceRecorder: a KeeperTap that turns the core's inputs and outputs into trace events.
#include <ampactor/trace/trace.h>

#include <iostream>

namespace ampactor {

TraceRecorder::TraceRecorder(std::shared_ptr<TraceSink> sink) : sink_(std::move(sink)) {}

void TraceRecorder::started(const GradScalerOptions& opts, ScalePolicy policy) {
  sink_->header(TraceHeader{opts, policy});
}

void TraceRecorder::stopped() {
  sink_->finish();
}

std::string TraceRecorder::name_of(peer_id who, Role role) {
  if (!who) return trace_anonymous;
  auto [it, fresh] = names_.try_emplace(who);
  if (fresh)
    it->second = role == Role::optimizer ? "optimizer" + std::to_string(++optimizers_)
                                         : "trainer" + std::to_string(++trainers_);
  return it->second;
}

void TraceRecorder::emit(iteration_t k, std::string from, std::string to, TraceMessage m) {
  sink_->event(TraceEvent{seq_++, k, std::move(from), std::move(to), std::move(m)});
}

void TraceRecorder::input(peer_id from, const KeeperInput& in) {
  const iteration_t k = iteration_of(in);
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, UnscaleDone>) {
          UnscaleDone r = m;
          r.optimizer =
              optimizer_ids_.try_emplace(m.optimizer, optimizer_ids_.size() + 1).first->second;
          emit(k, name_of(from, Role::optimizer), trace_keeper, r);
        } else if constexpr (std::is_same_v<T, IterationClosed>) {
          emit(k, name_of(from, Role::optimizer), trace_keeper, m);
        } else if constexpr (std::is_same_v<T, Subscribe>) {
          // The subscriber is named before the sender, as it appears in the message first.
          std::string sub = name_of(m.subscriber, Role::trainer);
          emit(k, name_of(from, Role::trainer), trace_keeper, TraceSubscribe{std::move(sub)});
        } else if constexpr (std::is_same_v<T, Unsubscribe>) {
          std::string sub = name_of(m.subscriber, Role::trainer);
          emit(k, name_of(from, Role::trainer), trace_keeper, TraceUnsubscribe{std::move(sub)});
        } else {
          emit(k, name_of(from, Role::trainer), trace_keeper, m);
        }
      },
      in);
}

void TraceRecorder::output(const KeeperOutput& out) {
  if (const auto* r = std::get_if<KeeperReply>(&out)) {
    const std::string to = name_of(r->to, Role::trainer);
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, KeeperError>)
            emit(r->k, trace_keeper, to, TraceErrorReply{m.code, m.what});
          else
            emit(r->k, trace_keeper, to, m);
        },
        r->msg);
    return;
  }
  const auto& p = std::get<KeeperPush>(out);
  // Recorded with or without subscribers: the update happened.
  emit(p.msg.k, trace_keeper, trace_subscribers, p.msg);
}

std::shared_ptr<TraceRecorder> record_trace(const std::string& path,
                                            const TraceFileOptions& options) {
  return std::make_shared<TraceRecorder>(std::make_shared<TraceFile>(path, options));
}

}  // namespace ampactor
