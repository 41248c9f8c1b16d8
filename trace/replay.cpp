#include <ampactor/trace/replay.h>
#include <ampactor/trace/rig.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>

namespace ampactor {

namespace {
/// The keeper's event as a trace of `version` recorded it: before version 7 no guard.
std::string as_recorded(TraceEvent e, int version) {
  if (version < 7) {
    if (auto* r = std::get_if<ScaleReply>(&e.msg)) r->guard = {};
    if (auto* a = std::get_if<UpdateApplied>(&e.msg)) a->guard = {};
  }
  return to_json_line(e);
}
}  // namespace

ReplayResult replay_trace(const Trace& trace) {
  ReplayResult r;
  KeeperRig b(trace.header);
  const auto& want = trace.events;
  const auto& got = b.events();
  auto line_of = [&](std::size_t i) {
    return i < trace.lines.size() ? trace.lines[i]
                                  : (trace.lines.empty() ? 2 : trace.lines.back() + 1);
  };
  // Compares what the keeper has recorded so far; false at a divergence.
  auto compare = [&]() {
    for (; r.matched < got.size(); ++r.matched) {
      const std::string g = as_recorded(got[r.matched], trace.header.version);
      if (r.matched >= want.size()) {
        if (!trace.complete) return true;  // the recording was cut here: the keeper went on
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
    if (!b.send(e)) continue;
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
  std::vector<KeeperInput> before;  // setters and loads sent after the previous update
  std::optional<KeeperInput> update;
  std::vector<UnscaleDone> reports;
  std::optional<IterationClosed> closed;
  // recorded
  std::optional<float> scale_used;
  std::optional<UpdateApplied> applied;
};

std::vector<IterationPlan> plan(const Trace& t) {
  std::map<iteration_t, IterationPlan> by_k;
  std::vector<iteration_t> order;  // iterations in the order of their UpdateScale
  std::map<iteration_t, float> replies;
  std::vector<KeeperInput> pending;  // setters and loads waiting for the next update
  for (const auto& e : t.events) {
    auto& it = by_k[e.k];
    it.k = e.k;
    std::optional<KeeperInput> update;
    if (auto* u = std::get_if<UpdateScale>(&e.msg)) update = *u;
    if (auto* u = std::get_if<UpdateWhenClosed>(&e.msg)) update = *u;
    if (auto* u = std::get_if<SetScale>(&e.msg)) update = *u;
    if (update) {
      if (!it.update) {  // a duplicate is dropped by the keeper
        it.update = *update;
        it.before = std::move(pending);
        pending.clear();
        order.push_back(e.k);
      }
    } else if (auto* d = std::get_if<UnscaleDone>(&e.msg)) {
      it.reports.push_back(*d);
      if (!it.scale_used) it.scale_used = d->scale_used;
    } else if (auto* c = std::get_if<IterationClosed>(&e.msg)) {
      it.closed = *c;
    } else if (auto* g = std::get_if<SetGrowthFactor>(&e.msg)) {
      pending.push_back(*g);
    } else if (auto* b = std::get_if<SetBackoffFactor>(&e.msg)) {
      pending.push_back(*b);
    } else if (auto* i = std::get_if<SetGrowthInterval>(&e.msg)) {
      pending.push_back(*i);
    } else if (auto* l = std::get_if<LoadStateDict>(&e.msg)) {
      pending.push_back(*l);
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

const char* basis_name(WhatIfBasis b) {
  switch (b) {
    case WhatIfBasis::none:
      return "";
    case WhatIfBasis::same:
      return "same";
    case WhatIfBasis::bound:
      return "bound";
    case WhatIfBasis::predicted:
      return "predicted";
    case WhatIfBasis::unknown:
      return "unknown";
  }
  return "";
}

std::pair<bool, WhatIfBasis> found_inf_at(const UnscaleDone& d, float scale) {
  const double s = d.scale_used, t = scale;
  if (t == s) return {d.found_inf, WhatIfBasis::same};
  if (d.found_inf) return {true, t > s ? WhatIfBasis::bound : WhatIfBasis::unknown};
  if (t < s) return {false, WhatIfBasis::bound};
  if (d.dtype_max <= 0 || !(s > 0)) return {false, WhatIfBasis::unknown};
  // A power-of-two ratio keeps every value on the dtype's grid, so this is exact then.
  return {d.grad_max * (t / s) > d.dtype_max, WhatIfBasis::predicted};
}

namespace {

/// The keeper's replies and UpdateApplied per iteration, read off the rig's events when asked.
class Outcomes {
 public:
  explicit Outcomes(const KeeperRig& b) : b_(b) {}
  std::optional<float> reply_for(iteration_t k) {
    collect();
    auto it = replies_.find(k);
    return it == replies_.end() ? std::nullopt : std::optional<float>(it->second);
  }
  std::optional<UpdateApplied> applied_for(iteration_t k) {
    collect();
    auto it = applied_.find(k);
    return it == applied_.end() ? std::nullopt : std::optional<UpdateApplied>(it->second);
  }

 private:
  void collect() {
    for (; seen_ < b_.events().size(); ++seen_) {
      const auto& m = b_.events()[seen_].msg;
      if (auto* s = std::get_if<ScaleReply>(&m)) replies_[s->k] = s->scale;
      if (auto* a = std::get_if<UpdateApplied>(&m)) applied_[a->k] = *a;
    }
  }
  const KeeperRig& b_;
  std::map<iteration_t, float> replies_;
  std::map<iteration_t, UpdateApplied> applied_;
  std::size_t seen_ = 0;
};

/// Sends p's unscale reports as if made at scale s, and fills the row's found_inf and basis.
void send_reports(KeeperRig& b, const std::string& optimizer, const IterationPlan& p, float s,
                  WhatIfRow& row) {
  row.has_unscales = !p.reports.empty() && !std::holds_alternative<SetScale>(*p.update);
  for (UnscaleDone d : p.reports) {
    const auto [found, basis] = found_inf_at(d, s);
    row.found_inf = row.found_inf || d.found_inf;
    row.whatif_found_inf = row.whatif_found_inf || found;
    row.basis = std::max(row.basis, basis);  // the weakest basis of the row's reports
    d.scale_used = s;
    d.found_inf = found;
    if (!found) d.overflow.clear(), d.found_by.clear();
    b.send(optimizer, d);
  }
  if (!row.has_unscales) row.basis = WhatIfBasis::none;
}

/// Counts a finished row's basis into r.
void tally(WhatIfResult& r, const WhatIfRow& row) {
  r.uncertain += row.basis == WhatIfBasis::unknown;
  r.predicted += row.basis == WhatIfBasis::predicted;
  r.predicted_changed +=
      row.basis == WhatIfBasis::predicted && row.whatif_found_inf != row.found_inf;
}

}  // namespace

WhatIfResult what_if(const Trace& trace, const TraceHeader& settings) {
  WhatIfResult r;
  const auto iters = plan(trace);
  KeeperRig b(settings);
  const std::string trainer = "trainer1";
  const std::string optimizer = "optimizer1";
  Outcomes outcomes(b);
  if (!iters.empty()) b.send(trainer, ScaleRequest{iters.front().k});
  for (std::size_t i = 0; i < iters.size(); ++i) {
    const IterationPlan& p = iters[i];
    for (const auto& m : p.before)
      b.send(trainer, m);
    b.send(trainer, *p.update);
    if (i + 1 < iters.size()) b.send(trainer, ScaleRequest{iters[i + 1].k});
    const float s = outcomes.reply_for(p.k).value_or(*p.scale_used);
    WhatIfRow row;
    row.k = p.k;
    send_reports(b, optimizer, p, s, row);
    if (p.closed) b.send(optimizer, *p.closed);

    row.recorded_scale = *p.scale_used;
    row.whatif_scale = s;
    if (p.applied) {
      row.recorded_backoff = p.applied->backed_off;
      row.recorded_grew = p.applied->grew;
      count(r.recorded, *p.applied, row.recorded_scale);
    }
    if (auto a = outcomes.applied_for(p.k)) {
      row.whatif_backoff = a->backed_off;
      row.whatif_grew = a->grew;
      count(r.whatif, *a, row.whatif_scale);
      if (a->halted) {
        r.halted_at = p.k;
        r.rows.push_back(row);
        break;
      }
    }
    tally(r, row);
    r.rows.push_back(row);
  }
  return r;
}

std::string what_if_csv(const WhatIfResult& r) {
  std::ostringstream o;
  o.precision(9);
  o << "k,found_inf,whatif_found_inf,basis,recorded_scale,whatif_scale,recorded_backoff,"
       "whatif_backoff,recorded_grew,whatif_grew\n";
  for (const auto& w : r.rows)
    o << w.k << ',' << int(w.found_inf) << ',' << int(w.whatif_found_inf) << ','
      << basis_name(w.basis) << ',' << w.recorded_scale << ',' << w.whatif_scale << ','
      << int(w.recorded_backoff) << ',' << int(w.whatif_backoff) << ',' << int(w.recorded_grew)
      << ',' << int(w.whatif_grew) << '\n';
  return o.str();
}

}  // namespace ampactor
