#include <ampactor/actors/replay.h>
#include <ampactor/actors/scale_keeper.h>
#include <ampactor/messages/registry.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/others.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

namespace ampactor {
namespace {

struct DeterministicConfig : caf::actor_system_config {
  DeterministicConfig() {
    register_messages(*this);
    set("scheduler.policy", caf::atom("testing"));
  }
};

/// A keeper under CAF's test coordinator, recording into a buffer, and one scoped actor per
/// sender name: messages are delivered only when run() says so, in the order they were sent.
struct Bench {
  DeterministicConfig cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<TraceBuffer> buf = std::make_shared<TraceBuffer>();
  scale_keeper_actor keeper;
  std::map<std::string, std::unique_ptr<caf::scoped_actor>> actors;

  explicit Bench(const TraceHeader& h) {
    keeper = spawn_scale_keeper(sys, h.opts, h.policy, false, buf);
    sched.run();
  }
  ~Bench() {
    caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    sched.run();
    drain();
    actors.clear();
  }

  caf::scoped_actor& actor(const std::string& name) {
    auto& a = actors[name];
    if (!a) a = std::make_unique<caf::scoped_actor>(sys);
    return *a;
  }

  /// Sends one input as `from` did and runs everything that follows from it.
  template <class M>
  void send(const std::string& from, const M& m) {
    if (from == trace_anonymous)
      caf::anon_send(keeper, m);
    else
      actor(from)->send(keeper, m);
    sched.run();
  }
  void send(const std::string& from, const TraceSubscribe& s) {
    caf::actor who{actor(s.subscriber)};
    if (from == trace_anonymous)
      caf::anon_send(keeper, subscribe_atom::value, who);
    else
      actor(from)->send(keeper, subscribe_atom::value, who);
    sched.run();
  }
  void send_event(const TraceEvent& e) {
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, ScaleRequest> || std::is_same_v<T, UnscaleDone> ||
                        std::is_same_v<T, UpdateScale> || std::is_same_v<T, IterationClosed> ||
                        std::is_same_v<T, GetParams> || std::is_same_v<T, SetParam> ||
                        std::is_same_v<T, GetStateDict> || std::is_same_v<T, LoadStateDict> ||
                        std::is_same_v<T, TraceSubscribe>)
            send(e.from, m);
        },
        e.msg);
  }

  /// Replies pile up in the senders' mailboxes; what counts is in the keeper's own record.
  void drain() {
    for (auto& [name, a] : actors)
      while (!(*a)->mailbox().empty())
        (*a)->receive([](caf::error&) {},
                      caf::others >> [](caf::message_view&) -> caf::result<caf::message> {
                        return caf::message{};
                      });
  }
};

}  // namespace

ReplayResult replay_trace(const Trace& trace) {
  ReplayResult r;
  Bench b(trace.header);
  const auto& want = trace.events;
  const auto& got = b.buf->events;
  auto line_of = [&](std::size_t i) {
    return i < trace.lines.size() ? trace.lines[i]
                                  : (trace.lines.empty() ? 2 : trace.lines.back() + 1);
  };
  // Compares what the keeper has recorded so far; false at a divergence.
  auto compare = [&]() {
    for (; r.matched < got.size(); ++r.matched) {
      const std::string g = to_json_line(got[r.matched]);
      if (r.matched >= want.size()) {
        r.identical = false;
        r.line = line_of(r.matched);
        r.got = g;
        return false;
      }
      const std::string w = to_json_line(want[r.matched]);
      if (g != w) {
        r.identical = false;
        r.line = line_of(r.matched);
        r.expected = w;
        r.got = g;
        return false;
      }
    }
    return true;
  };
  // A missing reply shows as the next input recorded where the trace has the reply.
  for (const auto& e : want) {
    if (!is_keeper_input(e.msg)) continue;
    b.send_event(e);
    b.drain();
    if (!compare()) return r;
  }
  if (r.matched < want.size()) {
    r.identical = false;
    r.line = line_of(r.matched);
    r.expected = to_json_line(want[r.matched]);
  }
  return r;
}

namespace {

struct IterationPlan {
  iteration_t k = 0;
  std::vector<TraceMessage> before;  // setters and loads sent with this k before its update
  std::optional<UpdateScale> update;
  std::vector<UnscaleDone> reports;
  std::optional<IterationClosed> closed;
  // recorded
  std::optional<float> scale_used;
  std::optional<UpdateApplied> applied;
};

std::vector<IterationPlan> plan(const Trace& t) {
  std::map<iteration_t, IterationPlan> by_k;
  std::vector<iteration_t> order;  // iterations in the order of their UpdateScale
  std::optional<float> last_reply;
  std::map<iteration_t, float> replies;
  for (const auto& e : t.events) {
    auto& it = by_k[e.k];
    it.k = e.k;
    if (auto* u = std::get_if<UpdateScale>(&e.msg)) {
      if (!it.update) {  // a duplicate is dropped by the keeper
        it.update = *u;
        order.push_back(e.k);
      }
    } else if (auto* d = std::get_if<UnscaleDone>(&e.msg)) {
      it.reports.push_back(*d);
      if (!it.scale_used) it.scale_used = d->scale_used;
    } else if (auto* c = std::get_if<IterationClosed>(&e.msg)) {
      it.closed = *c;
    } else if (std::holds_alternative<SetParam>(e.msg) ||
               std::holds_alternative<LoadStateDict>(e.msg)) {
      if (!it.update) it.before.push_back(e.msg);
    } else if (auto* a = std::get_if<UpdateApplied>(&e.msg)) {
      it.applied = *a;
    } else if (auto* s = std::get_if<ScaleReply>(&e.msg)) {
      replies[e.k] = s->scale;
    }
  }
  std::vector<IterationPlan> out;
  float prev = float(t.header.opts.init_scale());
  for (iteration_t k : order) {
    IterationPlan p = by_k[k];
    // The scale the gradients were made with: reported by the unscales, else the keeper's reply,
    // else (the exact facade, which takes the scale from UpdateApplied) the previous update's.
    if (!p.scale_used) p.scale_used = replies.count(k) ? replies[k] : prev;
    if (p.applied) prev = p.applied->scale;
    out.push_back(std::move(p));
  }
  return out;
}

void count(WhatIfCounts& c, const UpdateApplied& a, float scale) {
  ++c.iterations;
  c.skips += a.found_inf;
  c.backoffs += a.backed_off;
  c.growths += a.grew;
  c.final_scale = a.scale;
  c.min_scale = c.iterations == 1 ? std::min(double(scale), double(a.scale))
                                  : std::min({c.min_scale, double(scale), double(a.scale)});
}

}  // namespace

WhatIfResult what_if(const Trace& trace, const TraceHeader& settings) {
  WhatIfResult r;
  const auto iters = plan(trace);
  Bench b(settings);
  const std::string trainer = "trainer1";
  const std::string optimizer = "optimizer1";
  std::map<iteration_t, float> replies;
  std::map<iteration_t, UpdateApplied> applied;
  std::size_t seen = 0;
  auto collect = [&] {
    for (; seen < b.buf->events.size(); ++seen) {
      const auto& m = b.buf->events[seen].msg;
      if (auto* s = std::get_if<ScaleReply>(&m)) replies[s->k] = s->scale;
      if (auto* a = std::get_if<UpdateApplied>(&m)) applied[a->k] = *a;
    }
  };
  auto reply_for = [&](iteration_t k) -> std::optional<float> {
    collect();
    auto it = replies.find(k);
    return it == replies.end() ? std::nullopt : std::optional<float>(it->second);
  };
  auto applied_for = [&](iteration_t k) -> std::optional<UpdateApplied> {
    collect();
    auto it = applied.find(k);
    return it == applied.end() ? std::nullopt : std::optional<UpdateApplied>(it->second);
  };
  if (!iters.empty()) b.send(trainer, ScaleRequest{iters.front().k});
  for (std::size_t i = 0; i < iters.size(); ++i) {
    const IterationPlan& p = iters[i];
    for (const auto& m : p.before)
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, SetParam> || std::is_same_v<T, LoadStateDict>)
              b.send(trainer, x);
          },
          m);
    b.send(trainer, *p.update);
    if (i + 1 < iters.size()) b.send(trainer, ScaleRequest{iters[i + 1].k});
    const float s = reply_for(p.k).value_or(*p.scale_used);
    for (UnscaleDone d : p.reports) {
      d.scale_used = s;
      b.send(optimizer, d);
    }
    if (p.closed) b.send(optimizer, *p.closed);
    b.drain();

    WhatIfRow row;
    row.k = p.k;
    row.has_unscales = !p.reports.empty() && !p.update->has_new_scale;
    for (const auto& d : p.reports)
      row.found_inf = row.found_inf || d.found_inf;
    row.recorded_scale = *p.scale_used;
    row.whatif_scale = s;
    if (p.applied) {
      row.recorded_backoff = p.applied->backed_off;
      row.recorded_grew = p.applied->grew;
      count(r.recorded, *p.applied, row.recorded_scale);
    }
    if (auto a = applied_for(p.k)) {
      row.whatif_backoff = a->backed_off;
      row.whatif_grew = a->grew;
      count(r.whatif, *a, row.whatif_scale);
    }
    if (row.has_unscales && ((row.found_inf && row.whatif_scale < row.recorded_scale) ||
                             (!row.found_inf && row.whatif_scale > row.recorded_scale)))
      ++r.uncertain;
    r.rows.push_back(row);
  }
  return r;
}

std::string what_if_csv(const WhatIfResult& r) {
  std::ostringstream o;
  o.precision(9);
  o << "k,found_inf,recorded_scale,whatif_scale,recorded_backoff,whatif_backoff,recorded_grew,"
       "whatif_grew\n";
  for (const auto& w : r.rows)
    o << w.k << ',' << int(w.found_inf) << ',' << w.recorded_scale << ',' << w.whatif_scale << ','
      << int(w.recorded_backoff) << ',' << int(w.whatif_backoff) << ',' << int(w.recorded_grew)
      << ',' << int(w.whatif_grew) << '\n';
  return o.str();
}

}  // namespace ampactor
