// Per-layer overflow counts over a trace: which gradients held inf or NaN in how many iterations
// (UnscaleDone.overflow, schema 7), and at a what-if scale which of them still would.
#include <ampactor/trace/replay.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace ampactor {

namespace {
/// One iteration's overflow, gathered over its unscale reports (several optimizers).
struct Gathered {
  bool found = false;
  float scale = 0;
  std::map<std::string, std::pair<bool, bool>> tensors;  // name: inf, nan
  std::set<std::int32_t> ranks;
};
}  // namespace

LayerReport layer_overflows(const Trace& trace, const WhatIfResult* what_if) {
  std::map<iteration_t, Gathered> by_k;
  for (const auto& e : trace.events) {
    const auto* d = std::get_if<UnscaleDone>(&e.msg);
    if (!d || !d->found_inf) continue;
    Gathered& g = by_k[d->k];
    g.found = true;
    g.scale = d->scale_used;
    for (const OverflowTensor& t : d->overflow) {
      auto& [inf, nan] = g.tensors[t.name];
      inf = inf || t.inf;
      nan = nan || t.nan;
    }
    g.ranks.insert(d->found_by.begin(), d->found_by.end());
  }
  std::map<iteration_t, float> whatif_scale;
  if (what_if) {
    for (const WhatIfRow& w : what_if->rows)
      whatif_scale[w.k] = w.whatif_scale;
  }

  LayerReport r;
  r.what_if = what_if != nullptr;
  std::map<std::string, LayerOverflows> layers;
  std::map<std::int32_t, std::int64_t> ranks;
  for (const auto& [k, g] : by_k) {
    ++r.overflow_iterations;
    r.unattributed += g.tensors.empty();
    for (std::int32_t rank : g.ranks)
      ++ranks[rank];
    const auto w = whatif_scale.find(k);
    const bool counted = what_if && w != whatif_scale.end();  // the rows stop where it halted
    if (what_if && !counted) ++r.not_replayed;
    for (const auto& [name, flags] : g.tensors) {
      LayerOverflows& l = layers[name];
      l.name = name;
      ++l.iterations;
      l.inf += flags.first;
      l.nan += flags.second;
      if (l.first < 0) l.first = k;
      l.last = k;
      if (counted) (w->second >= g.scale ? l.still : l.unknown) += 1;
    }
  }
  for (auto& [name, l] : layers)
    r.layers.push_back(std::move(l));
  std::stable_sort(
      r.layers.begin(), r.layers.end(),
      [](const LayerOverflows& a, const LayerOverflows& b) { return a.iterations > b.iterations; });
  r.ranks.assign(ranks.begin(), ranks.end());
  return r;
}

std::string layer_csv(const LayerReport& r) {
  std::ostringstream o;
  o << "layer,iterations,inf,nan,first,last,still,unknown\n";
  for (const LayerOverflows& l : r.layers) {
    // A name is the user's: quoted, its quotes doubled (RFC 4180).
    std::string name = "\"";
    for (char c : l.name)
      name += c == '"' ? std::string("\"\"") : std::string(1, c);
    name += '"';
    o << name << ',' << l.iterations << ',' << l.inf << ',' << l.nan << ',' << l.first << ','
      << l.last << ',';
    if (r.what_if)
      o << l.still << ',' << l.unknown;
    else
      o << ',';
    o << '\n';
  }
  return o.str();
}

}  // namespace ampactor
