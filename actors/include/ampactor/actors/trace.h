// Message traces of the scale_keeper: every message it receives and every message it sends, in its
// mailbox order (the order that decides the scale), as JSON Lines. A trace replays bit for bit
// into a fresh keeper (<ampactor/actors/replay.h>). The schema is in README.md, "Traces".
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <ampactor/messages/messages.h>
#include <ampactor/scaler/options.h>

namespace ampactor {

/// The schema version written in every header and the only one read.
inline constexpr int trace_schema_version = 1;

/// First line of a trace: what a fresh keeper needs to be rebuilt.
struct TraceHeader {
  GradScalerOptions opts;
  ScalePolicy policy = ScalePolicy::exact;
};

/// keeper input: subscribe_atom with the subscriber's name.
struct TraceSubscribe {
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
    std::variant<ScaleRequest, UnscaleDone, UpdateScale, IterationClosed, GetParams, SetParam,
                 GetStateDict, LoadStateDict, TraceSubscribe,  // inputs
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
  iteration_t k = -1;  // the iteration the message belongs to (-1: none, e.g. Subscribe)
  std::string from;
  std::string to;
  TraceMessage msg;
};

/// One JSON object, no newline.
std::string to_json_line(const TraceHeader& h);
std::string to_json_line(const TraceEvent& e);

/// Where a keeper sends its trace. Called on the keeper's thread only, one call at a time; must not
/// throw (the keeper drops a sink that does).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void header(const TraceHeader& h) = 0;
  virtual void event(const TraceEvent& e) = 0;
};

/// Writes JSON Lines to a file. Opening fails with std::runtime_error; a later write error is kept
/// (ok() turns false) rather than thrown into the keeper.
class TraceFile final : public TraceSink {
 public:
  explicit TraceFile(const std::string& path);
  ~TraceFile() override;
  void header(const TraceHeader& h) override;
  void event(const TraceEvent& e) override;
  /// Flushes and closes; false if any write failed. Idempotent.
  bool close();
  bool ok() const;
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& line);
  mutable std::mutex mu_;
  std::string path_;
  std::vector<char> buf_;  // the stream's buffer: declared before it, destroyed after it
  std::ofstream out_;
  std::string line_;
  bool ok_ = true;
};

/// Keeps events in memory (tests, replay).
class TraceBuffer final : public TraceSink {
 public:
  void header(const TraceHeader& h) override { head = h; }
  void event(const TraceEvent& e) override { events.push_back(e); }
  TraceHeader head;
  std::vector<TraceEvent> events;
};

/// A trace that could not be read: what() names the file, the line and the problem.
class TraceError : public std::runtime_error {
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
};

/// Reads and validates a whole trace (header, every line's fields and types, sequence numbers
/// 0, 1, 2...); throws TraceError at the first problem. `source` names the input in errors.
Trace parse_trace(std::istream& in, const std::string& source = "trace");
Trace read_trace(const std::string& path);

}  // namespace ampactor
