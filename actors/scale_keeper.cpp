#include <ampactor/actors/scale_keeper.h>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <unordered_map>
#include <variant>

namespace ampactor {
namespace {

template <class T>
using promise = caf::typed_response_promise<T>;
using AnyPromise = std::variant<promise<ScaleReply>, promise<ScaleParams>, promise<StateDictMsg>>;

struct keeper_state {
  std::shared_ptr<KeeperCore> core;
  std::uint64_t next_request = 1;
  std::unordered_map<std::uint64_t, AnyPromise> pending;
  std::unordered_map<peer_id, trainer_actor> subscribers;
  ~keeper_state() {
    if (core) core->stop();
  }
  static inline const char* name = "ampactor.scale_keeper";
};

using keeper_ptr = scale_keeper_actor::stateful_pointer<keeper_state>;

peer_id sender_of(keeper_ptr self) {
  const auto& who = self->current_sender();
  return who ? peer_id(who->id()) : 0;
}

/// Sends what the core said, in its order.
void dispatch(keeper_ptr self, std::vector<KeeperOutput> outs) {
  auto& st = self->state;
  for (auto& o : outs) {
    if (auto* r = std::get_if<KeeperReply>(&o)) {
      auto it = st.pending.find(r->request);
      if (it == st.pending.end()) continue;  // every request has a promise: cannot happen
      std::visit(
          [&](auto& rp) {
            if (auto* e = std::get_if<KeeperError>(&r->msg)) {
              rp.deliver(make_error(e->code, e->what));
              return;
            }
            std::visit(
                [&](auto& msg) {
                  using M = std::decay_t<decltype(msg)>;
                  using P = std::decay_t<decltype(rp)>;
                  if constexpr (std::is_same_v<P, promise<M>>) rp.deliver(std::move(msg));
                },
                r->msg);
          },
          it->second);
      st.pending.erase(it);
    } else {
      const auto& p = std::get<KeeperPush>(o);
      for (peer_id id : p.to) {
        auto it = st.subscribers.find(id);
        if (it != st.subscribers.end()) caf::anon_send(it->second, p.msg);
      }
    }
  }
}

/// A request: its promise is registered under a token, then the core decides when it is answered.
template <class Res, class In>
caf::result<Res> ask(keeper_ptr self, const In& in) {
  auto& st = self->state;
  auto rp = self->template make_response_promise<Res>();
  const std::uint64_t token = st.next_request++;
  st.pending.emplace(token, rp);
  dispatch(self, st.core->handle(sender_of(self), in, token));
  return rp;
}

template <class In>
void tell(keeper_ptr self, const In& in) {
  dispatch(self, self->state.core->handle(sender_of(self), in));
}

scale_keeper_actor::behavior_type keeper(keeper_ptr self, std::shared_ptr<KeeperCore> core) {
  self->state.core = std::move(core);
  // CAF tries the handlers in this order, comparing type names: the per-iteration messages first.
  return {
      [=](UnscaleDone d) { tell(self, d); },
      [=](UpdateScale u) { tell(self, u); },
      [=](ScaleRequest r) { return ask<ScaleReply>(self, r); },
      [=](IterationClosed c) { tell(self, c); },
      [=](UpdateWhenClosed u) { tell(self, u); },
      [=](SetScale u) { tell(self, u); },
      [=](GetParams g) { return ask<ScaleParams>(self, g); },
      [=](SetGrowthFactor s) { return ask<ScaleParams>(self, s); },
      [=](SetBackoffFactor s) { return ask<ScaleParams>(self, s); },
      [=](SetGrowthInterval s) { return ask<ScaleParams>(self, s); },
      [=](GetStateDict g) { return ask<StateDictMsg>(self, g); },
      [=](LoadStateDict l) { return ask<ScaleParams>(self, l); },
      [=](subscribe_atom, trainer_actor who) {
        if (!who) return;
        const peer_id id = who.id();
        self->state.subscribers[id] = std::move(who);
        tell(self, Subscribe{id});
      },
      [=](unsubscribe_atom, trainer_actor who) {
        if (!who) return;
        const peer_id id = who.id();
        tell(self, Unsubscribe{id});
        self->state.subscribers.erase(id);
      },
  };
}

}  // namespace

scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      const KeeperOptions& options) {
  // Built here, so bad options throw to the caller and the tap hears started() before this
  // returns; the actor is its only owner from then on.
  auto core = std::make_shared<KeeperCore>(opts, options.policy(), options.tap());
  if (options.detached()) return sys.spawn<caf::detached>(keeper, std::move(core));
  return sys.spawn(keeper, std::move(core));
}

scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      ScalePolicy policy, bool detached,
                                      std::shared_ptr<KeeperTap> tap) {
  return spawn_scale_keeper(sys, opts,
                            KeeperOptions().policy(policy).detached(detached).tap(std::move(tap)));
}

}  // namespace ampactor
