// Message traces of the scale_keeper: every message it receives and every message it sends, in its
// mailbox order (the order that decides the scale), as JSON Lines. A trace replays bit for bit
// into a fresh keeper core (<ampactor/trace/replay.h>). The schema is
// doc/reference/trace-format.md. Recording is a KeeperTap (TraceRecorder): the keeper itself knows
// nothing of traces.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <memory>
#include <unordered_map>

#include <ampactor/core/arg.h>
#include <ampactor/core/errors.h>
#include <ampactor/core/options.h>
#include <ampactor/keeper/keeper_core.h>

namespace ampactor {

/// The schema version written in every header. Version 7 records which gradients overflowed
/// (UnscaleDone.overflow, found_by) and the scale-collapse guard (ScaleReply and UpdateApplied,
/// the header's guard); version 6 the ranks' own found_inf; version 5's UnscaleDone carries the
/// gradients' size (grad_max, dtype_max); version 4 added the update rule; version 3 ends a
/// complete trace with a trailer line ({"end":"ampactor","events":N}). Versions 1 to 6 are read
/// too (doc/reference/trace-format.md).
inline constexpr int trace_schema_version = 7;

/// First line of a trace: what a fresh keeper needs to be rebuilt.
struct TraceHeader {
  GradScalerOptions opts;
  ScalePolicy policy = ScalePolicy::exact;
  /// The schema version the trace was read in (a header is always written in the current one).
  int version = trace_schema_version;
};

/// keeper input: subscribe_atom with the subscriber's name.
struct TraceSubscribe {
  std::string subscriber;
};
/// keeper input: unsubscribe_atom with the subscriber's name.
struct TraceUnsubscribe {
  std::string subscriber;
};
/// keeper output: a refused setter or load_state_dict (the caf::error reply).
struct TraceErrorReply {
  errc code = errc::bad_state_dict;
  std::string what;
};

/// Every message a keeper receives or sends. The keeper's messages carry no tensors: found_inf is
/// already a bool when it reaches the keeper.
using TraceMessage =
    std::variant<ScaleRequest, UnscaleDone, UpdateScale, UpdateWhenClosed, SetScale,
                 IterationClosed, GetParams, SetGrowthFactor, SetBackoffFactor, SetGrowthInterval,
                 GetStateDict, LoadStateDict, TraceSubscribe, TraceUnsubscribe,  // inputs
                 ScaleReply, ScaleParams, StateDictMsg, UpdateApplied, TraceErrorReply>;

/// The message type as written in a trace ("ScaleRequest", ..., "Subscribe", "Error").
const char* trace_type_name(const TraceMessage& m);
/// A message to the keeper (false: one from it).
bool is_keeper_input(const TraceMessage& m);

/// Name of the keeper, and of the receiver of UpdateApplied (sent to every subscriber, recorded
/// once), and of a sender without an actor (anon_send).
inline constexpr const char* trace_keeper = "keeper";
inline constexpr const char* trace_subscribers = "subscribers";
inline constexpr const char* trace_anonymous = "anonymous";

struct TraceEvent {
  std::uint64_t seq = 0;
  iteration_t k = -1;  // the iteration the message belongs to (-1: none, e.g. GetParams)
  std::string from;
  std::string to;
  TraceMessage msg;
};

/// One JSON object, no newline.
std::string to_json_line(const TraceHeader& h);
std::string to_json_line(const TraceEvent& e);

/// Where a TraceRecorder writes. Called on the keeper's thread only, one call at a time; must not
/// throw (the keeper drops a recorder whose sink does).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void header(const TraceHeader& h) = 0;
  virtual void event(const TraceEvent& e) = 0;
  /// The keeper stopped: nothing more comes.
  virtual void finish() {}
  /// Why the sink records no more, or "" while it records (TraceFile::failure). Any thread.
  virtual std::string failure() const { return {}; }
};

/// Writes JSON Lines to a file. Opening fails with ScalerError(errc::bad_trace); a later write
/// error is kept (ok() turns false) rather than thrown into the keeper. finish() writes the trailer
/// and closes it. Crash-safe: the header is flushed at once, the records at every iteration's end
/// (the keeper's UpdateApplied) and at least once a second, so a killed process leaves every
/// finished iteration but the last second's at most, and a file without trailer says it was cut
/// short. TraceFile's options: TraceFileOptions().flush_iterations(false).
class TraceFileOptions {
  /// Flush at every iteration's end (crash-safe, the default); false: only when the 1 MiB buffer
  /// is full or a second has passed, for the least recording cost (a crash then loses up to a
  /// second of records).
  AMPACTOR_ARG_ANY(bool, flush_iterations, true);
};

class TraceFile final : public TraceSink {
 public:
  explicit TraceFile(const std::string& path, const TraceFileOptions& options = {});
  ~TraceFile() override;
  void header(const TraceHeader& h) override;
  void event(const TraceEvent& e) override;
  void finish() override { close(); }
  /// Flushes and closes; false if any write failed. Idempotent.
  bool close();
  bool ok() const;
  /// After a failed write: the file, the events recorded whole and the system's reason, "" before.
  /// The file is cut back to its last whole flush and ends with a trailer saying where the
  /// recording stopped and why (when that still fits); nothing more is written.
  std::string failure() const override;
  const std::string& path() const;

 private:
  struct State;  // the stream, its buffer and lock: in write.cpp, out of every includer's way
  std::unique_ptr<State> state_;
};

/// Keeps events in memory (tests, replay).
class TraceBuffer final : public TraceSink {
 public:
  void header(const TraceHeader& h) override { head = h; }
  void event(const TraceEvent& e) override { events.push_back(e); }
  TraceHeader head;
  std::vector<TraceEvent> events;
};

/// The tap that records a keeper: names its peers by role and order of first appearance
/// ("trainer1", "optimizer1", ...) and renumbers optimizers 1, 2, ... the same way, so two runs of
/// one program give the same trace (actor ids and optimizer addresses vary).
class TraceRecorder final : public KeeperTap {
 public:
  explicit TraceRecorder(std::shared_ptr<TraceSink> sink);
  void started(const GradScalerOptions& opts, ScalePolicy policy) override;
  void input(peer_id from, const KeeperInput& in) override;
  void output(const KeeperOutput& out) override;
  void stopped() override;
  std::string failure() const override { return sink_->failure(); }
  const std::shared_ptr<TraceSink>& sink() const { return sink_; }

 private:
  enum class Role { trainer, optimizer };
  std::string name_of(peer_id who, Role role);
  void emit(iteration_t k, std::string from, std::string to, TraceMessage m);

  std::shared_ptr<TraceSink> sink_;
  std::uint64_t seq_ = 0;
  std::unordered_map<peer_id, std::string> names_;
  int trainers_ = 0;
  int optimizers_ = 0;
  std::unordered_map<optimizer_id, optimizer_id> optimizer_ids_;
};

/// A recorder writing to a new (or truncated) file at `path`, complete once the keeper stops
/// (e.g. when the GradScaler it is given to is destroyed). ScalerError(errc::bad_trace) if the file
/// cannot be created.
std::shared_ptr<TraceRecorder> record_trace(const std::string& path,
                                            const TraceFileOptions& options = {});

/// A trace that could not be read: what() names the file, the line and the problem.
class TraceError : public ScalerError {
 public:
  TraceError(const std::string& source, std::size_t line, const std::string& problem);
  /// 1-based line; 0 when the file itself is the problem (missing, unreadable).
  std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

struct Trace {
  TraceHeader header;
  std::vector<TraceEvent> events;
  /// events[i] was read from line lines[i] (1-based).
  std::vector<std::size_t> lines;
  /// The recording ended normally: version 3's trailer was read (versions 1 and 2 have none and
  /// count as complete). A recording cut short (a crash, a kill) has no trailer.
  bool complete = true;
  /// Read with `prefix`: the line where the intact part ended and why (0: it did not).
  std::size_t stopped_at = 0;
  std::string stop_reason;
};

/// Reads and validates a whole trace (header, every line's fields and types, sequence numbers
/// 0, 1, 2..., the trailer); throws TraceError at the first problem. `source` names the input in
/// errors. prefix: a bad line after the header ends the trace there instead (stopped_at and
/// stop_reason say where and why; the trace is then incomplete).
Trace parse_trace(std::istream& in, const std::string& source = "trace", bool prefix = false);
Trace read_trace(const std::string& path, bool prefix = false);

}  // namespace ampactor
