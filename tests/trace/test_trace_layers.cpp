// Schema 7: which gradients overflowed and the collapse guard's view, recorded in traces, read
// back, refused when inconsistent, and counted per layer by replay (also at a what-if scale).
#include "trace_fixture.h"

#include <torch/optim/sgd.h>

namespace {

const Trace& golden_overflow() {
  static const Trace t = read_trace(golden("overflow_exact.jsonl").string());
  return t;
}

/// A one-event trace (the golden header) with `msg` as its UnscaleDone's fields.
std::string trace_with_unscale(const std::string& msg) {
  auto lines = lines_of(slurp(golden("overflow_exact.jsonl")));
  return lines[0] + "\n" +
         R"({"seq":0,"k":0,"from":"optimizer1","to":"keeper","type":"UnscaleDone","msg":{"k":0,)" +
         R"("optimizer":1,"scale_used":1024.0,"grad_max":0.0,"dtype_max":0.0,)" + msg + "}}\n" +
         R"({"end":"ampactor","events":1})" + "\n";
}

/// What reading `text` throws ("" when it reads).
std::string refusal(const std::string& text) {
  std::istringstream in(text);
  try {
    parse_trace(in);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

const LayerOverflows* layer(const LayerReport& r, const std::string& name) {
  for (const auto& l : r.layers)
    if (l.name == name) return &l;
  return nullptr;
}

}  // namespace

TEST_CASE("an attributed golden trace reads back the planted gradients and replays identically") {
  const Trace& t = golden_overflow();
  CHECK(replay_trace(t).identical);
  for (const auto& e : t.events) {
    const auto* d = std::get_if<UnscaleDone>(&e.msg);
    if (!d) continue;
    CAPTURE(d->k);
    std::vector<std::string> got;
    for (const auto& o : d->overflow)
      got.push_back(o.name + (o.inf ? ":inf" : "") + (o.nan ? ":nan" : ""));
    const std::vector<std::string> want =
        d->k == 5                ? std::vector<std::string>{"fc1.weight:inf", "fc2.bias:nan"}
        : d->k == 4 || d->k == 9 ? std::vector<std::string>{"fc1.weight:inf"}
                                 : std::vector<std::string>{};
    CHECK(got == want);
    if (d->k == 5) CHECK(d->overflow[1].neighbours_max == 0.25);
  }
}

TEST_CASE("per-layer overflow counts of a trace: iterations, inf and NaN, first and last") {
  const LayerReport r = layer_overflows(golden_overflow());
  CHECK(r.overflow_iterations == 3);
  CHECK(r.unattributed == 0);
  CHECK(r.ranks.empty());
  REQUIRE(r.layers.size() == 2);
  CHECK(r.layers[0].name == "fc1.weight");  // most iterations first
  CHECK(r.layers[0].iterations == 3);
  CHECK(r.layers[0].inf == 3);
  CHECK(r.layers[0].nan == 0);
  CHECK(r.layers[0].first == 4);
  CHECK(r.layers[0].last == 9);
  CHECK(r.layers[1].name == "fc2.bias");
  CHECK(r.layers[1].nan == 1);
  CHECK(r.layers[1].first == 5);
  CHECK(layer_csv(r) ==
        "layer,iterations,inf,nan,first,last,still,unknown\n"
        "\"fc1.weight\",3,3,0,4,9,,\n"
        "\"fc2.bias\",1,0,1,5,5,,\n");
}

TEST_CASE(
    "what-if per layer: still overflowing at a scale at least the recorded one, else unknown") {
  const Trace& t = golden_overflow();
  for (double init : {128.0, 1024.0, 65536.0}) {
    CAPTURE(init);
    TraceHeader settings = t.header;
    settings.opts.init_scale(init);
    const WhatIfResult w = what_if(t, settings);
    const LayerReport r = layer_overflows(t, &w);
    CHECK(r.what_if);
    // Expected from the rows: an overflow iteration counts as still where the what-if scale is
    // at least the recorded one.
    std::int64_t still = 0, unknown = 0;
    for (const WhatIfRow& row : w.rows)
      if (row.k == 4 || row.k == 5 || row.k == 9)
        (row.whatif_scale >= row.recorded_scale ? still : unknown) += 1;
    const LayerOverflows* fc1 = layer(r, "fc1.weight");
    REQUIRE(fc1);
    CHECK(fc1->still == still);
    CHECK(fc1->unknown == unknown);
    CHECK(fc1->still + fc1->unknown == 3);
    if (init == 1024.0) CHECK(fc1->still == 3);  // the recorded settings: every one still
    if (init == 128.0) CHECK(fc1->unknown > 0);  // smaller scales: not known
  }
}

TEST_CASE(
    "the collapse guard golden trace: the guard's view at the exact iterations, ranks named") {
  const Trace t = read_trace(golden("collapse_guard_exact.jsonl").string());
  CHECK(replay_trace(t).identical);
  CHECK(t.header.opts.collapse_backoffs() == 3);
  CHECK(t.header.opts.collapse_below() == 0.5);
  std::map<iteration_t, ScaleGuard> applied;
  for (const auto& e : t.events)
    if (const auto* a = std::get_if<UpdateApplied>(&e.msg)) applied[a->k] = a->guard;
  // Overflows at 2..6 from 8: 4, 2, 1, 0.5, 0.25; the third in a row (4) trips the guard, the
  // scale stays below 0.5 after 6; update(new_scale) at 9 ends it.
  CHECK(applied.at(1) == ScaleGuard{0, false});
  CHECK(applied.at(3) == ScaleGuard{2, false});
  CHECK(applied.at(4) == ScaleGuard{3, true});
  CHECK(applied.at(6) == ScaleGuard{5, true});
  CHECK(applied.at(8) == ScaleGuard{0, true});  // clean steps, but 0.25 < 0.5
  CHECK(applied.at(9) == ScaleGuard{0, false});
  const LayerReport r = layer_overflows(t);
  REQUIRE(r.ranks.size() == 1);
  CHECK(r.ranks[0] == std::pair<std::int32_t, std::int64_t>{1, 5});
  REQUIRE(r.layers.size() == 1);
  CHECK(r.layers[0].name == "out.weight");
  CHECK(r.layers[0].iterations == 5);
}

TEST_CASE("schema 7's fields are refused where inconsistent or in an older version") {
  const std::string ok = R"("found_inf":true,"local_found_inf":true,)"
                         R"("overflow":[{"name":"w","index":0,"inf":true,"nan":false,)"
                         R"("neighbours_max":"nan"}],"found_by":[0])";
  CHECK(refusal(trace_with_unscale(ok)).empty());
  CHECK(refusal(trace_with_unscale(
                    R"("found_inf":false,"local_found_inf":false,"overflow":[{"name":"w",)"
                    R"("index":0,"inf":true,"nan":false,"neighbours_max":1.0}],"found_by":[])"))
            .find("overflow or found_by without found_inf") != std::string::npos);
  CHECK(refusal(trace_with_unscale(
                    R"("found_inf":true,"local_found_inf":true,"overflow":[],"found_by":[-1])"))
            .find("found_by: expected an array of ranks") != std::string::npos);
  CHECK(refusal(trace_with_unscale(R"("found_inf":true,"local_found_inf":true,)"
                                   R"("overflow":[{"name":"w"}],"found_by":[])"))
            .find("UnscaleDone.overflow[0]: missing field \"index\"") != std::string::npos);
  CHECK(refusal(trace_with_unscale(R"("found_inf":true,"local_found_inf":true,"overflow":[)"
                                   R"({"name":"w","index":0,"inf":false,"nan":false,)"
                                   R"("neighbours_max":1.0}],"found_by":[])"))
            .find("overflow[0]: neither inf nor nan") != std::string::npos);
  // A guard in a version 6 header: that version had none.
  auto lines = lines_of(slurp(golden("v6/overflow_exact.jsonl")));
  const std::string head = lines[0].substr(0, lines[0].size() - 2) +
                           R"(,"guard":{"collapse_backoffs":3,"collapse_below":1.0,)"
                           R"("raise_on_collapse":false}}})";
  CHECK(refusal(head + "\n").find("guard") != std::string::npos);
}

TEST_CASE("a GradScaler's trace names the gradient that overflowed, and replay counts it") {
  const fs::path path = scratch() / "attributed.jsonl";
  std::vector<at::Tensor> p;
  torch::OrderedDict<std::string, at::Tensor> named;
  for (int i = 0; i < 3; ++i) {
    p.push_back(at::zeros({8}).set_requires_grad(true));
    named.insert("layer" + std::to_string(i) + ".weight", p.back());
  }
  {
    torch::optim::SGD opt(p, torch::optim::SGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(256).growth_interval(100),
                      KeeperOptions().tap(record_trace(path.string())));
    scaler.name_parameters(named);
    for (int k = 0; k < 4; ++k) {
      for (auto& t : p)
        t.mutable_grad() = at::ones({8});
      if (k == 1 || k == 3) p[1].mutable_grad()[2] = k == 1 ? INFINITY : NAN;
      scaler.scale(at::ones({}));
      scaler.step(opt);
      scaler.update();
    }
    scaler.sync();
  }
  const Trace t = read_trace(path.string());
  CHECK(replay_trace(t).identical);
  const LayerReport r = layer_overflows(t);
  CHECK(r.overflow_iterations == 2);
  REQUIRE(r.layers.size() == 1);
  CHECK(r.layers[0].name == "layer1.weight");
  CHECK(r.layers[0].inf == 1);
  CHECK(r.layers[0].nan == 1);
  CHECK(r.layers[0].first == 1);
  CHECK(r.layers[0].last == 3);
}
