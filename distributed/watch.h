// Inside ampactor::distributed: what the ranks keep in the store about each other (joined, a
// heartbeat, the process behind each rank, why one failed) and what a failing rank makes of it.
#pragma once

#include <ampactor/distributed/dist.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ampactor::dist::detail {

/// The key under which the first rank to fail says why (and its count, to take the first).
inline const char* const kFirstFailure = "ampactor/first_failure";
inline const char* const kFirstFailureCount = "ampactor/first_failure_count";
inline const char* const kFirstFailureSeen = "ampactor/first_failure_seen";
inline std::string key(const char* what, int r) {
  return std::string("ampactor/") + what + "/" + std::to_string(r);
}
/// An environment variable's value, or nullptr where it is unset or empty.
const char* env(const char* name);
/// This host's name (gethostname), or "".
std::string host_name();
std::vector<std::uint8_t> bytes_of(const std::string& s);
std::string string_of(const std::vector<std::uint8_t>& b);
/// An exception's first line: c10d's errors carry a backtrace that no rank's message needs.
std::string brief(const std::exception& e);
/// A duration in whole milliseconds, for messages: "3000 ms".
inline std::string ms_of(std::chrono::steady_clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

/// The process behind a rank, as it wrote it into the store when it joined.
struct Place {
  long pid = 0;
  unsigned long long started = 0;  // since boot, in clock ticks: a reused pid has another
  std::string host;                // boot id and pid namespace: equal means pids compare
  std::string host_name;

  static Place here();
  static Place parse(const std::string& text);
  std::string text() const;
  /// What can be seen of the process from this one: unknown on another host.
  enum class State { unknown, exited, stopped, running };
  State state() const;
  /// "its process 1234 on this host has exited", "... is stopped (SIGSTOP or a debugger)", ...
  std::string said(State s) const;
};

/// A gloo error on a closed connection would otherwise kill the process (SIGPIPE) with no word;
/// ignored unless the program has its own handler.
void ignore_sigpipe();

/// One rank's side: its heartbeat thread, the others' places, and the diagnosis of a failure.
class Watch {
 public:
  Watch(c10::intrusive_ptr<c10d::Store> store, int rank, int size, DistOptions options);
  /// Leaves (without waiting for hung ranks) unless left already, then stops the heartbeat.
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  /// Where the store is and whether rank 0 hosts it (else torchrun's agent does), for messages.
  void hosted_by(std::string where, bool rank0);
  /// Says this rank joined and waits until every rank has, by `deadline`; else throws
  /// ScalerError(errc::rank_failed) naming the ranks that joined and those that did not. Before
  /// waiting it refuses, on every rank at once, a world size that differs from another rank's,
  /// a rank that joined twice, and `own_refusal` (this rank's own reason, if not empty).
  void join(std::chrono::steady_clock::time_point deadline, const std::string& own_refusal = {});
  /// Why a collective or the store failed with `error`: a rank that said why, a silent rank
  /// (exited, stopped or hung where its process can be seen), the store's host, or the reason
  /// the others recorded when this rank was the one stopped.
  std::string diagnose(const std::string& error);
  /// Says this rank left; rank 0, the store's host, then waits (at most the timeout, longer for a
  /// stopped rank that resumes) for the others to leave or be gone, so that none finds the store
  /// gone instead of a reason. `for_hung`: also for ranks whose process is alive but silent.
  void leave(bool for_hung) noexcept;
  const std::string& where() const { return where_; }

 private:
  /// The heartbeat thread's state, which it shares: ~Watch may leave the thread behind, blocked
  /// in a store call, and what it still touches must outlive the Watch.
  struct Heart {
    c10::intrusive_ptr<c10d::Store> store;
    std::string key;
    std::chrono::milliseconds period;
    // Its sleep: a sleep that overran by far means the process was stopped.
    std::atomic<std::int64_t> sleeping_since{0}, stalled_ms{0}, stall_end{0};
    // Since when its store call has been waiting (0: none): a store that does not answer for
    // ten periods is one a failing rank need not ask (a lost host, a cut link).
    std::atomic<std::int64_t> calling_since{0};
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false, done = false;
    // The first failure any rank reported, read while the store answers: after an abort takes
    // the store with it, the survivors still name that rank (under mu).
    std::string first_failure;
    std::string own;  // "rank R ": this rank's own failure, which it need not hear of
  };
  static void beat(const std::shared_ptr<Heart>& h);
  std::string stall() const;
  std::string store_host_down() const;
  std::string said_failed();
  std::string silent(const std::vector<std::int64_t>& before);
  std::string recorded();
  std::string first_failure() const;
  bool mine(const std::string& failure) const;
  [[noreturn]] void refuse_all(const std::string& why);
  [[noreturn]] void refused(const std::string& why);
  std::string store_host() const;
  std::string store_silent() const;
  Place::State state_of(int r) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  DistOptions options_;
  std::string where_;
  bool rank0_hosts_ = true;
  std::mutex silent_mu_;
  std::vector<int> found_silent_;  // the ranks a diagnosis found silent: leave() waits not
  std::vector<Place> places_;      // empty until joined
  std::atomic<bool> left_{false};
  std::shared_ptr<Heart> heart_;
  std::thread beating_;
};

/// over() with a Watch that has joined already (init() joins before forming the group).
std::shared_ptr<RankGroup> over_watched(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                        c10::intrusive_ptr<c10d::Store> store, int rank,
                                        int world_size, const DistOptions& options,
                                        std::unique_ptr<Watch> watch);

}  // namespace ampactor::dist::detail
