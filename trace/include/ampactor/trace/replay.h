// Replaying a keeper trace (<ampactor/trace/trace.h>) into a fresh keeper core (KeeperRig, no
// actors): exactly (every reply must equal the recorded one), or as a what-if with
// other settings over the same found_inf sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ampactor/trace/trace.h>

namespace ampactor {

struct ReplayResult {
  bool identical = true;
  /// Events of the trace that matched before the first divergence (all of them when identical).
  std::size_t matched = 0;
  /// The first divergence: the trace's line (the line after the last one when the fresh keeper
  /// did more than the trace holds), the recorded event and what the fresh keeper did ("" for
  /// nothing), both as JSON lines.
  std::size_t line = 0;
  std::string expected;
  std::string got;
};

/// Sends the trace's inputs, in recorded order and from peers standing for the recorded senders,
/// to a keeper core built from its header, and compares every event the keeper records (inputs,
/// replies, UpdateApplied) with the trace. Stops at the first divergence. An incomplete trace
/// (!trace.complete) is compared as far as it goes: what the keeper does after its last event is
/// no divergence, and `identical` then means "identical as far as it goes" (say so).
ReplayResult replay_trace(const Trace& trace);

/// How a what-if row's found_inf at the what-if scale was decided.
enum class WhatIfBasis : std::uint8_t {
  none,       // no unscale reports (an update(new_scale), an abandoned iteration)
  same,       // the what-if scale is the recorded one: as recorded
  bound,      // follows from the record whatever the size: clean at a smaller scale, an
              // overflow at a larger one
  predicted,  // from the recorded gradient size: largest finite |gradient| x what-if scale /
              // recorded scale against the dtype's largest finite value
  unknown     // cannot be told: an overflow recorded at a larger scale (the size of the inf/NaN
              // elements is not known; a NaN or inf no scale avoids looks the same), or a clean
              // step at a smaller scale in a trace without sizes. Taken as recorded.
};

/// "same", "bound", "predicted", "unknown" ("" for none).
const char* basis_name(WhatIfBasis b);

struct WhatIfRow {
  iteration_t k = 0;
  bool found_inf = false;         // as recorded
  bool whatif_found_inf = false;  // at the what-if scale (see basis)
  WhatIfBasis basis = WhatIfBasis::none;
  bool has_unscales = false;  // an update from unscale reports (not a new_scale or abandoned)
  float recorded_scale = 0;   // the scale iteration k's gradients were made with
  float whatif_scale = 0;
  bool recorded_backoff = false;
  bool whatif_backoff = false;
  bool recorded_grew = false;
  bool whatif_grew = false;
};

struct WhatIfCounts {
  std::int64_t iterations = 0;
  std::int64_t skips = 0;  // updates that saw found_inf (that iteration's steps were skipped)
  std::int64_t backoffs = 0;
  std::int64_t growths = 0;
  double final_scale = 0;
  double min_scale = 0;
};

struct WhatIfResult {
  std::vector<WhatIfRow> rows;
  WhatIfCounts recorded;
  WhatIfCounts whatif;
  /// Rows whose what-if found_inf cannot be told (WhatIfBasis::unknown) and is taken as recorded.
  std::int64_t uncertain = 0;
  /// Rows predicted from the gradient size (WhatIfBasis::predicted), and those of them whose
  /// prediction differs from the record (an overflow the other scale would have had, or not).
  std::int64_t predicted = 0;
  std::int64_t predicted_changed = 0;
  /// The what-if keeper raised at this iteration (the deepspeed rule at its minimum, where
  /// DeepSpeed ends the run): the rows stop there. -1: it did not.
  iteration_t halted_at = -1;
};

/// Drives a fresh keeper with `settings` through the trace's iterations as an asynchronous trainer
/// would (iteration k's update, then ScaleRequest{k+1}, then iteration k's unscale reports, so the
/// lagged policy answers one iteration late), with the recorded setters, loads and new_scale
/// updates at their iterations. Each unscale report carries the scale the what-if keeper gave
/// that iteration and the found_inf that scale gives: predicted from the recorded gradient size
/// where the trace has it (schema 5), else as recorded (WhatIfBasis says which, per row). The
/// prediction assumes the gradients scale with the loss scale (nothing overflowed inside the
/// backward pass before the gradients); it is exact when the two scales differ by a power of two.
WhatIfResult what_if(const Trace& trace, const TraceHeader& settings);

/// found_inf of one unscale report at another scale, and how that was decided.
std::pair<bool, WhatIfBasis> found_inf_at(const UnscaleDone& recorded, float scale);

/// The rows as CSV, with a header line.
std::string what_if_csv(const WhatIfResult& r);

/// One gradient's overflows over a trace, by name (schema 7 records them: UnscaleDone.overflow).
struct LayerOverflows {
  std::string name;
  std::int64_t iterations = 0;  // iterations in which it held inf or NaN
  std::int64_t inf = 0;         // of them, those with inf
  std::int64_t nan = 0;         // and those with NaN
  iteration_t first = -1, last = -1;
  /// With a what-if: of `iterations`, those in which it still overflows at the what-if scale (at
  /// least the recorded one: what made the inf or NaN makes it again), and those that cannot be
  /// told (a smaller scale: how large the inf elements' values would have been is not known).
  std::int64_t still = 0;
  std::int64_t unknown = 0;
};

struct LayerReport {
  std::vector<LayerOverflows> layers;  // most iterations first, then by name
  /// Iterations whose unscale found inf or NaN, and of them those without a named gradient (a
  /// path that does not attribute, or a trace older than schema 7).
  std::int64_t overflow_iterations = 0;
  std::int64_t unattributed = 0;
  /// Data parallel: each rank whose own check found inf or NaN, with the number of iterations.
  std::vector<std::pair<std::int32_t, std::int64_t>> ranks;
  /// Counted against a what-if (still and unknown are set).
  bool what_if = false;
  /// Overflowing iterations the what-if has no row for (after it halted, or never updated): not
  /// counted in still or unknown.
  std::int64_t not_replayed = 0;
};

/// Per-layer overflow counts of a trace; with `what_if` (what_if(trace, settings) of the same
/// trace), also which layers would still have overflowed at its scales.
LayerReport layer_overflows(const Trace& trace, const WhatIfResult* what_if = nullptr);

/// The layers as CSV, with a header line (still and unknown empty without a what-if).
std::string layer_csv(const LayerReport& r);

}  // namespace ampactor
