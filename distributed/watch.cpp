// A rank's watch over the others: what it says in the store (heartbeat, survivor, verdict, left;
// joining is watch_join.cpp's) and how a failing rank names the culprit from what the others said
// there.
#include "watch.h"

#include <ampactor/core/errors.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>

namespace ampactor::dist::detail {
namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::int64_t ns_of(clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

Watch::Watch(c10::intrusive_ptr<c10d::Store> store, int rank, int size, DistOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {
  ignore_sigpipe();
  if (const auto* tcp = dynamic_cast<const c10d::TCPStore*>(store_.get()))
    where_ = tcp->getHost() + ":" + std::to_string(tcp->getPort());
  heart_ = std::make_shared<Heart>();
  heart_->store = store_;
  heart_->key = key("heartbeat", rank_);
  heart_->own = "rank " + std::to_string(rank_) + " ";
  heart_->period = options_.heartbeat();
  beating_ = std::thread([h = heart_] { beat(h); });
}

Watch::~Watch() {
  leave(/*for_hung=*/false);
  std::unique_lock<std::mutex> lock(heart_->mu);
  heart_->stop = true;
  heart_->cv.notify_all();
  // A heartbeat blocked in the store waits for its host's reply, with no timeout in LibTorch 2.x's
  // TCPStore client: a stopped host would hold this rank's exit. Such a thread is left behind
  // (it holds what it uses), at once where the host is seen stopped or gone, else after the
  // timeout.
  const auto wait = store_host_down().empty() ? options_.timeout() : milliseconds(0);
  const bool ended = heart_->cv.wait_for(lock, wait, [this] { return heart_->done; });
  lock.unlock();
  if (ended)
    beating_.join();
  else
    beating_.detach();
}

void Watch::hosted_by(std::string where, bool rank0) {
  where_ = std::move(where);
  rank0_hosts_ = rank0;
}

std::string Watch::store_host() const {
  return rank0_hosts_ ? "rank 0, which hosts it," : "torchrun's agent, which hosts it,";
}

std::string Watch::diagnose(const std::string& error) {
  const std::string said = " (c10d: " + error + ")";
  const auto with_stall = [&](const std::string& s) {
    const std::string st = stall();
    return (st.empty() ? s : st + "; " + s) + said;
  };
  const std::string first = first_failure();
  const auto with_first = [&](const std::string& s) {
    return first.empty() ? s : first + "; " + s;
  };
  // A call to a stopped store waits the whole timeout, and one that is gone has nothing to say.
  if (auto s = store_host_down(); !s.empty()) return with_stall(with_first(s));
  if (auto s = store_silent(); !s.empty()) return with_stall(with_first(s));
  try {
    // Alive and aware: no other rank's diagnosis may take this one for the culprit.
    store_->set(key("survivor", rank_), bytes_of("1"));
    if (auto s = said_failed(); !s.empty()) return with_stall(s);
    std::vector<std::int64_t> before(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r)
      before[std::size_t(r)] = store_->add(key("heartbeat", r), 0);
    // Ten periods: a live rank's heartbeat thread ticks within them even on a loaded machine.
    std::this_thread::sleep_for(options_.heartbeat() * 10);
    // A failing rank may have said so while this one waited.
    if (auto s = said_failed(); !s.empty()) return with_stall(s);
    if (auto s = silent(before); !s.empty()) {
      store_->set(key("verdict", rank_), bytes_of(s));  // for a stopped rank to read once resumed
      return with_stall(s);
    }
    if (auto s = recorded(); !s.empty()) return with_stall(s);
    return with_stall("no rank is known to have failed (a rank may be stuck or on another call)");
  } catch (const std::exception& e) {
    const auto s = rank0_hosts_ ? state_of(0) : Place::State::unknown;
    return with_stall(
        with_first("the store" + (where_.empty() ? "" : " at " + where_) + " cannot be reached (" +
                   brief(e) + "): " + store_host() + " " +
                   (s == Place::State::unknown  ? "is gone or unreachable"
                    : s == Place::State::exited ? "is gone: " + places_[0].said(s)
                                                : "is unreachable: " + places_[0].said(s))));
  }
}

void Watch::leave(bool for_hung) noexcept {
  if (left_.exchange(true)) return;
  try {
    if (!store_host_down().empty()) return;  // no store to tell
    store_->set(key("left", rank_), bytes_of("1"));
    if (rank_ != 0) return;
    const clock::duration hb = options_.heartbeat(), timeout = options_.timeout();
    const auto start = clock::now();
    auto deadline = start + timeout;
    std::vector<std::int64_t> beats(static_cast<std::size_t>(size_), -1);
    std::vector<clock::time_point> changed(static_cast<std::size_t>(size_), start);
    {
      // Found silent for ten periods already: waited for only if they beat again.
      std::lock_guard<std::mutex> lock(silent_mu_);
      for (const int r : found_silent_) {
        beats[std::size_t(r)] = store_->add(key("heartbeat", r), 0);
        changed[std::size_t(r)] = start - hb * 10;
      }
    }
    while (clock::now() < deadline) {
      bool waiting = false;
      for (int r = 1; r < size_; ++r) {
        const auto i = std::size_t(r);
        if (store_->check({key("left", r)})) continue;
        const std::int64_t b = store_->add(key("heartbeat", r), 0);
        const auto s = state_of(r);
        if (b == 0 || s == Place::State::exited) continue;  // never joined, or its process is gone
        const auto now = clock::now();
        if (b != beats[i]) {
          // Silent for ten periods and beating again: a stopped rank resumed. It needs its
          // collective's timeout and a diagnosis to fail and read why the others gave up.
          if (for_hung && beats[i] >= 0 && now - changed[i] >= hb * 10)
            deadline = std::min(std::max(deadline, now + timeout + hb * 20), start + 3 * timeout);
          beats[i] = b, changed[i] = now;
        }
        // Gone once silent for ten periods (as in diagnose()), unless its process is still here.
        if (now - changed[i] < hb * 10) waiting = true;
        if (for_hung && (s == Place::State::stopped || s == Place::State::running)) waiting = true;
      }
      if (!waiting) return;
      std::this_thread::sleep_for(hb);
    }
  } catch (...) {
    // The store fails: nobody can read from it any more.
  }
}

void Watch::beat(const std::shared_ptr<Heart>& h) {
  const auto hb = h->period;
  std::unique_lock<std::mutex> lock(h->mu);
  while (!h->stop) {
    lock.unlock();
    try {
      h->calling_since = ns_of(clock::now());
      h->store->add(h->key, 1);
      h->calling_since = 0;
      bool known = false;
      {
        std::lock_guard<std::mutex> l(h->mu);
        known = !h->first_failure.empty();
      }
      if (!known && h->store->check({kFirstFailure})) {
        std::string why = string_of(h->store->get(kFirstFailure));
        // The failing rank waits until every other rank's heartbeat has it: not for its own.
        const bool own = why.rfind(h->own, 0) == 0;
        {
          std::lock_guard<std::mutex> l(h->mu);
          h->first_failure = std::move(why);
        }
        if (!own) h->store->add(kFirstFailureSeen, 1);
      }
    } catch (...) {
      lock.lock();
      break;  // the store is gone: a failing collective will say so
    }
    lock.lock();
    const auto from = clock::now();
    h->sleeping_since = ns_of(from);
    h->cv.wait_for(lock, hb, [&h] { return h->stop; });
    const auto now = clock::now();
    h->sleeping_since = 0;
    // Only a stopped (or starved) process oversleeps by ten periods.
    if (now - from - hb >= hb * 10) {
      h->stalled_ms = std::chrono::duration_cast<milliseconds>(now - from - hb).count();
      h->stall_end = ns_of(now);
    }
  }
  h->done = true;
  h->cv.notify_all();
}

/// This rank's own recent stall, which the others may have taken for a hang.
std::string Watch::stall() const {
  const auto hb = options_.heartbeat();
  const std::int64_t now = ns_of(clock::now()), since = heart_->sleeping_since;
  std::int64_t ms = since ? (now - since) / 1000000 - hb.count() : 0;
  const auto recent = std::chrono::nanoseconds(options_.timeout() + hb * 20).count();
  if (now - heart_->stall_end < recent) ms = std::max<std::int64_t>(ms, heart_->stalled_ms.load());
  if (ms < (hb * 10).count()) return {};
  return "this rank was stopped or stalled for " + std::to_string(ms) + " ms" +
         (ms < options_.timeout().count() ? ""
                                          : ", longer than the " + ms_of(options_.timeout()) +
                                                " timeout, so the others may have given up on it");
}

/// Rank 0 stopped or exited, seen without asking the store it hosts.
std::string Watch::store_host_down() const {
  if (rank_ == 0 || !rank0_hosts_) return {};
  const auto s = state_of(0);
  if (s == Place::State::stopped)
    return "rank 0 is hung: " + places_[0].said(s) + ", so the store it hosts cannot answer";
  if (s == Place::State::exited)
    return "rank 0 is gone: " + places_[0].said(s) + ", and the store it hosted with it";
  return {};
}

std::string Watch::first_failure() const {
  std::lock_guard<std::mutex> lock(heart_->mu);
  return mine(heart_->first_failure) ? std::string() : heart_->first_failure;
}

bool Watch::mine(const std::string& failure) const {
  return failure.rfind(heart_->own, 0) == 0;
}

/// The store's host, seen gone from this rank's heartbeat, which has waited for it ten periods.
std::string Watch::store_silent() const {
  const std::int64_t since = heart_->calling_since;
  if (since == 0 || (rank_ == 0 && rank0_hosts_)) return {};
  const auto waited = std::chrono::nanoseconds(ns_of(clock::now()) - since);
  if (waited < options_.heartbeat() * 10) return {};
  return "the store" + (where_.empty() ? "" : " at " + where_) + " has not answered for " +
         ms_of(waited) + ": " + store_host() +
         " is gone or unreachable (its host lost, or the link to it cut)";
}

std::string Watch::said_failed() {
  // The first to fail, where known: the others may have failed because of it.
  if (store_->check({kFirstFailure}))
    if (std::string t = string_of(store_->get(kFirstFailure)); !mine(t)) return t;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && store_->check({key("failed", r)}))
      return "rank " + std::to_string(r) + " failed: " + string_of(store_->get(key("failed", r)));
  return {};
}

/// The ranks whose heartbeat did not move since `before`, and what their processes are doing.
std::string Watch::silent(const std::vector<std::int64_t>& before) {
  const std::string window = ms_of(options_.heartbeat() * 10);
  std::string found;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || store_->add(key("heartbeat", r), 0) != before[std::size_t(r)] ||
        store_->check({key("survivor", r)}))
      continue;
    const std::string rank = "rank " + std::to_string(r);
    const auto s = state_of(r);
    {
      std::lock_guard<std::mutex> lock(silent_mu_);
      found_silent_.push_back(r);
    }
    std::string what;
    if (store_->check({key("left", r)}))
      what = rank + " has left (its group was destroyed: its run ended or it gave up)";
    else if (s == Place::State::exited)
      what = rank + " is gone (heartbeat stopped): " + places_[std::size_t(r)].said(s);
    else if (s != Place::State::unknown)
      what = rank + " is hung (no heartbeat in " + window + "): " + places_[std::size_t(r)].said(s);
    else
      what = rank + " sent no heartbeat in " + window + ": hung or gone" +
             (places_.empty() ? "" : " (" + places_[std::size_t(r)].said(s) + ")");
    found += (found.empty() ? "" : "; ") + what;
  }
  return found;
}

/// What another rank found when it gave up, for a rank that was away (stopped) meanwhile.
std::string Watch::recorded() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && store_->check({key("verdict", r)}))
      return "rank " + std::to_string(r) +
             " recorded: " + string_of(store_->get(key("verdict", r)));
  return {};
}

Place::State Watch::state_of(int r) const {
  return places_.empty() ? Place::State::unknown : places_[std::size_t(r)].state();
}

}  // namespace ampactor::dist::detail
