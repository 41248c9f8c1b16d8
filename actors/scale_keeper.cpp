#include <ampactor/actors/scale_keeper.h>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <variant>
#include <vector>

namespace ampactor {
namespace {

/// What has arrived for one iteration from the optimizer side.
struct Unscales {
  std::int32_t count = 0;
  bool found_inf = false;
  /// The smallest scale_used among reports with found_inf (lagged policy: if it is larger than
  /// the current scale, that overflow event was already backed off).
  float min_inf_scale = INFINITY;
};

template <class T>
using promise = caf::typed_response_promise<T>;

struct QueuedScaleRequest {
  ScaleRequest req;
  promise<ScaleReply> rp;
};
struct QueuedGet {
  promise<ScaleParams> rp;
};
struct QueuedSet {
  SetParam req;
  promise<ScaleParams> rp;
};
struct QueuedStateDict {
  promise<StateDictMsg> rp;
};
struct QueuedLoad {
  LoadStateDict req;
  promise<ScaleParams> rp;
};
using Command = std::variant<UpdateScale, QueuedScaleRequest, QueuedGet, QueuedSet, QueuedStateDict,
                             QueuedLoad>;

struct keeper_state {
  ScaleState state;
  ScalePolicy policy = ScalePolicy::exact;
  iteration_t applied_through = -1;
  std::map<iteration_t, Unscales> unscales;
  /// What the optimizer said of iterations whose unscale count the trainer did not know.
  std::map<iteration_t, IterationClosed> closed;
  std::deque<Command> queue;
  std::vector<caf::actor> subscribers;
  static inline const char* name = "ampactor.scale_keeper";
};

using keeper_ptr = scale_keeper_actor::stateful_pointer<keeper_state>;

ScaleParams params(const keeper_state& st) {
  return {st.applied_through,        st.state.get_scale(),       st.state.growth_factor(),
          st.state.backoff_factor(), st.state.growth_interval(), st.state.growth_tracker()};
}

bool ready(const keeper_state& st, const UpdateScale& u) {
  if (u.has_new_scale || u.k <= st.applied_through) return true;  // a duplicate is dropped
  if (u.expected_unscales == unscales_from_optimizer) return st.closed.count(u.k) != 0;
  auto it = st.unscales.find(u.k);
  const std::int32_t got = it == st.unscales.end() ? 0 : it->second.count;
  return got >= u.expected_unscales;
}

void apply_update(keeper_ptr self, const UpdateScale& u) {
  auto& st = self->state;
  st.state.lazy_init();
  UpdateApplied out;
  out.k = u.k;
  const auto closed = st.closed.find(u.k);
  if (u.has_new_scale) {
    st.state.set_scale(u.new_scale);
  } else if (closed != st.closed.end() &&
             (closed->second.abandoned || closed->second.unscales == 0)) {
    // A failed, cancelled or unscale-less iteration: like torch, where update() is then never
    // reached or refuses, the state stays as it is.
    out.abandoned = true;
  } else {
    const Unscales got = st.unscales[u.k];
    out.found_inf = got.found_inf;
    // One overflow event, one backoff: an overflow found only with scales larger than the current
    // one was produced before the backoff that already answered it.
    const bool stale =
        st.policy == ScalePolicy::lagged && got.found_inf && got.min_inf_scale > st.state.scale();
    if (stale) {
      st.state.reset_tracker();
    } else {
      const UpdateOutcome o = st.state.update(got.found_inf);
      out.backed_off = o.backed_off;
      out.grew = o.grew;
    }
  }
  st.unscales.erase(u.k);
  if (closed != st.closed.end()) st.closed.erase(closed);
  st.applied_through = std::max(st.applied_through, u.k);
  out.scale = st.state.scale();
  out.growth_tracker = st.state.growth_tracker();
  for (auto& s : st.subscribers)
    caf::anon_send(s, out);
}

caf::error apply_set(keeper_state& st, const SetParam& s) {
  try {
    switch (s.which) {
      case Param::growth_factor:
        st.state.set_growth_factor(s.value);
        break;
      case Param::backoff_factor:
        st.state.set_backoff_factor(s.value);
        break;
      case Param::growth_interval:
        if (s.value != double(std::int64_t(s.value)))
          return make_error(errc::bad_growth_interval, "The growth interval must be an integer.");
        st.state.set_growth_interval(std::int64_t(s.value));
        break;
    }
  } catch (const ScalerError& e) {
    return make_error(e.code(), e.what());
  }
  return {};
}

/// Runs queued commands in mailbox order until one must wait.
void drain(keeper_ptr self) {
  auto& st = self->state;
  while (!st.queue.empty()) {
    Command& head = st.queue.front();
    if (auto* u = std::get_if<UpdateScale>(&head)) {
      if (!ready(st, *u)) return;
      if (u->k > st.applied_through) apply_update(self, *u);  // an update is never applied twice
    } else if (auto* r = std::get_if<QueuedScaleRequest>(&head)) {
      r->rp.deliver(ScaleReply{r->req.k, st.state.scale()});
    } else if (auto* g = std::get_if<QueuedGet>(&head)) {
      g->rp.deliver(params(st));
    } else if (auto* s = std::get_if<QueuedSet>(&head)) {
      if (auto err = apply_set(st, s->req))
        s->rp.deliver(std::move(err));
      else
        s->rp.deliver(params(st));
    } else if (auto* d = std::get_if<QueuedStateDict>(&head)) {
      d->rp.deliver(to_message(make_state_dict(st.state)));
    } else if (auto* l = std::get_if<QueuedLoad>(&head)) {
      try {
        load_state_dict(st.state, from_message(l->req.state));
        l->rp.deliver(params(st));
      } catch (const ScalerError& e) {
        l->rp.deliver(make_error(e.code(), e.what()));
      }
    }
    st.queue.pop_front();
  }
}

/// Queues a request behind the commands before it (it is answered in order) and runs the queue.
template <class Res, class Make>
caf::result<Res> queue_request(keeper_ptr self, Make make) {
  auto rp = self->make_response_promise<Res>();
  self->state.queue.emplace_back(make(rp));
  drain(self);
  return rp;
}

scale_keeper_actor::behavior_type keeper(keeper_ptr self, GradScalerOptions opts,
                                         ScalePolicy policy) {
  self->state.state = ScaleState(opts);
  self->state.policy = policy;
  return {
      [=](ScaleRequest req) -> caf::result<ScaleReply> {
        auto& st = self->state;
        st.state.lazy_init();
        if (st.policy == ScalePolicy::lagged || st.queue.empty())
          return ScaleReply{req.k, st.state.scale()};
        auto rp = self->make_response_promise<ScaleReply>();
        st.queue.emplace_back(QueuedScaleRequest{req, rp});
        return rp;
      },
      [=](UnscaleDone d) {
        auto& st = self->state;
        if (d.k <= st.applied_through) return;  // late report for an applied update: ignored
        Unscales& u = st.unscales[d.k];
        ++u.count;
        if (d.found_inf) {
          u.found_inf = true;
          u.min_inf_scale = std::min(u.min_inf_scale, d.scale_used);
        }
        drain(self);
      },
      [=](IterationClosed c) {
        auto& st = self->state;
        if (c.k <= st.applied_through) return;
        st.closed[c.k] = c;
        drain(self);
      },
      [=](UpdateScale u) {
        self->state.queue.emplace_back(u);
        drain(self);
      },
      [=](GetParams g) -> caf::result<ScaleParams> {
        auto& st = self->state;
        if (!g.up_to_date || st.queue.empty()) return params(st);
        auto rp = self->make_response_promise<ScaleParams>();
        st.queue.emplace_back(QueuedGet{rp});
        return rp;
      },
      [=](SetParam s) {
        return queue_request<ScaleParams>(self, [&](auto rp) { return QueuedSet{s, rp}; });
      },
      [=](GetStateDict) {
        return queue_request<StateDictMsg>(self, [](auto rp) { return QueuedStateDict{rp}; });
      },
      [=](LoadStateDict l) {
        return queue_request<ScaleParams>(self, [&](auto rp) { return QueuedLoad{l, rp}; });
      },
      [=](subscribe_atom, caf::actor who) { self->state.subscribers.push_back(std::move(who)); },
  };
}

}  // namespace

scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      ScalePolicy policy, bool detached) {
  opts.validate();
  if (detached) return sys.spawn<caf::detached>(keeper, opts, policy);
  return sys.spawn(keeper, opts, policy);
}

}  // namespace ampactor
