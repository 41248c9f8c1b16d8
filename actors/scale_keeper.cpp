#include <ampactor/actors/scale_keeper.h>
#include <ampactor/actors/trace.h>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <map>
#include <string>
#include <unordered_map>
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

// `to`: the requester's name in the trace (empty when not tracing).
struct QueuedScaleRequest {
  ScaleRequest req;
  promise<ScaleReply> rp;
  std::string to;
};
struct QueuedGet {
  GetParams req;
  promise<ScaleParams> rp;
  std::string to;
};
struct QueuedSet {
  SetParam req;
  promise<ScaleParams> rp;
  std::string to;
};
struct QueuedStateDict {
  GetStateDict req;
  promise<StateDictMsg> rp;
  std::string to;
};
struct QueuedLoad {
  LoadStateDict req;
  promise<ScaleParams> rp;
  std::string to;
};
using Command = std::variant<UpdateScale, QueuedScaleRequest, QueuedGet, QueuedSet, QueuedStateDict,
                             QueuedLoad>;

/// The keeper's recording state. Actors are named by role and order of first appearance
/// ("trainer1", "optimizer1", ...) and optimizers renumbered 1, 2, ... the same way, so two runs of
/// one program give the same trace (CAF's actor ids and optimizer addresses vary).
struct Tracer {
  std::shared_ptr<TraceSink> sink;
  std::uint64_t seq = 0;
  std::unordered_map<caf::actor_id, std::string> names;
  int trainers = 0;
  int optimizers = 0;
  std::unordered_map<optimizer_id, optimizer_id> optimizer_ids;
};

enum class Role { trainer, optimizer };

struct keeper_state {
  ScaleState state;
  ScalePolicy policy = ScalePolicy::exact;
  iteration_t applied_through = -1;
  std::map<iteration_t, Unscales> unscales;
  /// What the optimizer said of iterations whose unscale count the trainer did not know.
  std::map<iteration_t, IterationClosed> closed;
  std::deque<Command> queue;
  std::vector<caf::actor> subscribers;
  Tracer trace;
  static inline const char* name = "ampactor.scale_keeper";
};

using keeper_ptr = scale_keeper_actor::stateful_pointer<keeper_state>;

ScaleParams params(const keeper_state& st) {
  return {st.applied_through,        st.state.get_scale(),       st.state.growth_factor(),
          st.state.backoff_factor(), st.state.growth_interval(), st.state.growth_tracker()};
}

std::string name_of(Tracer& t, const caf::strong_actor_ptr& who, Role role) {
  if (!who) return trace_anonymous;
  auto [it, fresh] = t.names.try_emplace(who->id());
  if (fresh)
    it->second = role == Role::optimizer ? "optimizer" + std::to_string(++t.optimizers)
                                         : "trainer" + std::to_string(++t.trainers);
  return it->second;
}

void emit(Tracer& t, iteration_t k, std::string from, std::string to, TraceMessage m) {
  try {
    t.sink->event(TraceEvent{t.seq++, k, std::move(from), std::move(to), std::move(m)});
  } catch (const std::exception& e) {
    // A sink must not throw; if one does, recording stops and the keeper goes on.
    std::cerr << "ampactor: scale_keeper trace stopped: " << e.what() << "\n";
    t.sink.reset();
  }
}

/// Records a message to the keeper; returns the sender's name (where the reply goes).
template <class M>
std::string trace_in(keeper_ptr self, iteration_t k, const M& m, Role role = Role::trainer) {
  Tracer& t = self->state.trace;
  if (!t.sink) return {};
  std::string from = name_of(t, self->current_sender(), role);
  emit(t, k, from, trace_keeper, m);
  return from;
}

template <class M>
void trace_out(keeper_state& st, iteration_t k, const std::string& to, const M& m) {
  if (st.trace.sink) emit(st.trace, k, trace_keeper, to, m);
}

void trace_error(keeper_state& st, iteration_t k, const std::string& to, const caf::error& err) {
  if (!st.trace.sink) return;
  const ScalerError e = to_exception(err);
  emit(st.trace, k, trace_keeper, to, TraceErrorReply{e.code(), e.what()});
}

bool ready(const keeper_state& st, const UpdateScale& u) {
  if (u.has_new_scale || u.k <= st.applied_through) return true;  // a duplicate is dropped
  if (u.expected_unscales == unscales_from_optimizer) return st.closed.count(u.k) != 0;
  auto it = st.unscales.find(u.k);
  const std::int32_t got = it == st.unscales.end() ? 0 : it->second.count;
  if (got >= u.expected_unscales) return true;
  // A job whose unscales were counted in advance failed before making them: they never come.
  const auto closed = st.closed.find(u.k);
  return closed != st.closed.end() && closed->second.abandoned;
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
  // Recorded with or without subscribers, after they are told (off the trainer's critical path).
  trace_out(st, u.k, trace_subscribers, out);
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
      const ScaleReply out{r->req.k, st.state.scale()};
      r->rp.deliver(out);
      trace_out(st, r->req.k, r->to, out);
    } else if (auto* g = std::get_if<QueuedGet>(&head)) {
      g->rp.deliver(params(st));
      trace_out(st, g->req.k, g->to, params(st));
    } else if (auto* s = std::get_if<QueuedSet>(&head)) {
      if (auto err = apply_set(st, s->req)) {
        trace_error(st, s->req.k, s->to, err);
        s->rp.deliver(std::move(err));
      } else {
        trace_out(st, s->req.k, s->to, params(st));
        s->rp.deliver(params(st));
      }
    } else if (auto* d = std::get_if<QueuedStateDict>(&head)) {
      const StateDictMsg out = to_message(make_state_dict(st.state));
      trace_out(st, d->req.k, d->to, out);
      d->rp.deliver(out);
    } else if (auto* l = std::get_if<QueuedLoad>(&head)) {
      try {
        load_state_dict(st.state, from_message(l->req.state));
        trace_out(st, l->req.k, l->to, params(st));
        l->rp.deliver(params(st));
      } catch (const ScalerError& e) {
        auto err = make_error(e.code(), e.what());
        trace_error(st, l->req.k, l->to, err);
        l->rp.deliver(std::move(err));
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
                                         ScalePolicy policy, std::shared_ptr<TraceSink> trace) {
  self->state.state = ScaleState(opts);
  self->state.policy = policy;
  self->state.trace.sink = std::move(trace);
  return {
      [=](ScaleRequest req) -> caf::result<ScaleReply> {
        auto& st = self->state;
        std::string from = trace_in(self, req.k, req);
        st.state.lazy_init();
        if (st.policy == ScalePolicy::lagged || st.queue.empty()) {
          const ScaleReply out{req.k, st.state.scale()};
          trace_out(st, req.k, from, out);
          return out;
        }
        auto rp = self->make_response_promise<ScaleReply>();
        st.queue.emplace_back(QueuedScaleRequest{req, rp, std::move(from)});
        return rp;
      },
      [=](UnscaleDone d) {
        auto& st = self->state;
        if (st.trace.sink) {
          UnscaleDone r = d;
          auto& ids = st.trace.optimizer_ids;
          r.optimizer = ids.try_emplace(d.optimizer, ids.size() + 1).first->second;
          trace_in(self, d.k, r, Role::optimizer);
        }
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
        trace_in(self, c.k, c, Role::optimizer);
        if (c.k <= st.applied_through) return;
        st.closed[c.k] = c;
        drain(self);
      },
      [=](UpdateScale u) {
        trace_in(self, u.k, u);
        self->state.queue.emplace_back(u);
        drain(self);
      },
      [=](GetParams g) -> caf::result<ScaleParams> {
        auto& st = self->state;
        std::string from = trace_in(self, g.k, g);
        if (!g.up_to_date || st.queue.empty()) {
          trace_out(st, g.k, from, params(st));
          return params(st);
        }
        auto rp = self->make_response_promise<ScaleParams>();
        st.queue.emplace_back(QueuedGet{g, rp, std::move(from)});
        return rp;
      },
      [=](SetParam s) {
        std::string from = trace_in(self, s.k, s);
        return queue_request<ScaleParams>(self, [&](auto rp) { return QueuedSet{s, rp, from}; });
      },
      [=](GetStateDict g) {
        std::string from = trace_in(self, g.k, g);
        return queue_request<StateDictMsg>(self, [&](auto rp) {
          return QueuedStateDict{g, rp, from};
        });
      },
      [=](LoadStateDict l) {
        std::string from = trace_in(self, l.k, l);
        return queue_request<ScaleParams>(self, [&](auto rp) { return QueuedLoad{l, rp, from}; });
      },
      [=](subscribe_atom, caf::actor who) {
        auto& t = self->state.trace;
        if (t.sink) {
          const auto sub = name_of(t, caf::actor_cast<caf::strong_actor_ptr>(who), Role::trainer);
          trace_in(self, -1, TraceSubscribe{sub});
        }
        self->state.subscribers.push_back(std::move(who));
      },
  };
}

}  // namespace

scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      ScalePolicy policy, bool detached,
                                      std::shared_ptr<TraceSink> trace) {
  opts.validate();
  if (trace) trace->header(TraceHeader{opts, policy});
  if (detached) return sys.spawn<caf::detached>(keeper, opts, policy, std::move(trace));
  return sys.spawn(keeper, opts, policy, std::move(trace));
}

}  // namespace ampactor
