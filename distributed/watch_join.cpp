// A rank's joining: the world size the ranks agree on, one process a rank, the refusals every
// rank reads, and the wait until every rank has joined (or the naming of those that did not).
#include "watch.h"

#include <ampactor/core/errors.h>

#include <algorithm>
#include <sstream>
#include <thread>

namespace ampactor::dist::detail {
namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// "rank 2", "ranks 0, 1", "no rank".
std::string ranks_text(const std::vector<int>& rs) {
  if (rs.empty()) return "no rank";
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < rs.size(); ++i)
    s += (i ? ", " : "") + std::to_string(rs[i]);
  return s;
}

const char* const kJoined = "ampactor/joined";
const char* const kWorld = "ampactor/world";
const char* const kRefused = "ampactor/refused";
const char* const kRefusedSeen = "ampactor/refused_seen";

/// Why this rank's world size is refused where the first rank's differs ("" where they agree).
std::string other_world_size(c10d::Store& store, int rank, int size, const std::string& host) {
  const std::string mine = std::to_string(size) + " " + std::to_string(rank) + " " + host;
  std::istringstream first(string_of(store.compareSet(kWorld, {}, bytes_of(mine))));
  int world = size, by = rank;
  std::string by_host;
  first >> world >> by >> by_host;
  if (world == size) return {};
  return "WORLD_SIZE=" + std::to_string(size) + " here (on " + host + "), but rank " +
         std::to_string(by) + " (on " + by_host + ") has WORLD_SIZE=" + std::to_string(world) +
         ": every rank must be started with one world size (ampactor-launch: the same "
         "--nnodes and --nproc on every node)";
}

/// Claims `rank` for this process; why that is refused where another process claimed it first
/// (naming that one), or "".
std::string second_claim(c10d::Store& store, int rank, const Place& here, const std::string& host) {
  const std::int64_t claim = store.add(key("claim", rank), 1);
  const std::string place_key = key("claimed", rank) + "/" + std::to_string(claim);
  store.set(place_key, bytes_of(here.text()));
  if (claim <= 1) return {};
  const std::string first_key = key("claimed", rank) + "/1";
  std::string other = "another process";
  try {
    store.wait({first_key}, std::chrono::seconds(1));
    const Place p = Place::parse(string_of(store.get(first_key)));
    other = "process " + std::to_string(p.pid) + " on " +
            (p.host_name.empty() ? std::string("another host") : p.host_name);
  } catch (const std::exception&) {
  }
  return "rank " + std::to_string(rank) + " joined twice: " + other + " and process " +
         std::to_string(here.pid) + " on " + host +
         " (two launches given the same ranks: each node needs its own --node-rank)";
}

/// Which ranks joined by the deadline and which did not (their keys in the store say).
std::string joined_by_deadline(c10d::Store& store, const std::vector<std::string>& keys,
                               const std::string& at, milliseconds timeout) {
  std::vector<int> in, out;
  for (std::size_t r = 0; r < keys.size(); ++r)
    (store.check({keys[r]}) ? in : out).push_back(int(r));
  return ranks_text(in) + " of " + std::to_string(keys.size()) + " joined " + at + " within the " +
         ms_of(timeout) + " timeout; " + ranks_text(out) +
         " did not (not started, or failed before reaching the store)";
}

}  // namespace

void Watch::refuse_all(const std::string& why) {
  // The first reason stays: every rank then reads the one that started it.
  store_->compareSet(kRefused, {}, bytes_of(why));
  refused(why);
}

void Watch::refused(const std::string& why) {
  store_->add(kRefusedSeen, 1);
  // Rank 0 hosts the store: it stays until as many processes as the run has ranks have read why
  // (a rank still to come finds the reason, not a store gone), at most the timeout.
  if (rank_ == 0 && rank0_hosts_) {
    const auto deadline = clock::now() + options_.timeout();
    while (store_->add(kRefusedSeen, 0) < size_ && clock::now() < deadline)
      std::this_thread::sleep_for(options_.heartbeat());
  }
  throw ScalerError(errc::rank_failed, why);
}

void Watch::join(clock::time_point deadline, const std::string& own_refusal) {
  const std::string me = "rank " + std::to_string(rank_) + ": ";
  const std::string at = "the store" + (where_.empty() ? "" : " at " + where_);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r)
    keys.push_back(key("joined", r));
  try {
    const Place here = Place::here();
    const std::string host = here.host_name.empty() ? "-" : here.host_name;
    // The first rank's world size is the run's: one launched with another is refused at once.
    if (auto why = other_world_size(*store_, rank_, size_, host); !why.empty())
      refuse_all(me + why);
    if (!own_refusal.empty()) refuse_all(own_refusal);
    // One process a rank: a second claim of it is refused at once, naming the first.
    if (auto why = second_claim(*store_, rank_, here, host); !why.empty()) {
      left_ = true;  // the rank is the first claimer's: this one never says it left
      refuse_all(why);
    }
    store_->set(keys[std::size_t(rank_)], bytes_of(here.text()));
    // A count to poll (one key, however many ranks), the keys to name who is missing.
    store_->add(kJoined, 1);
    while (!(store_->add(kJoined, 0) >= size_ && store_->check(keys))) {
      if (store_->check({kRefused}))
        refused(me + "the run was refused: " + string_of(store_->get(kRefused)));
      const auto now = clock::now();
      if (now >= deadline)
        throw ScalerError(errc::rank_failed,
                          me + joined_by_deadline(*store_, keys, at, options_.timeout()));
      std::this_thread::sleep_for(std::min<clock::duration>(options_.heartbeat(), deadline - now));
    }
    for (int r = 0; r < size_; ++r)
      places_.push_back(Place::parse(string_of(store_->get(keys[std::size_t(r)]))));
  } catch (const ScalerError&) {
    throw;
  } catch (const std::exception& e) {
    throw ScalerError(errc::rank_failed, me + at + " failed while the ranks joined (" + brief(e) +
                                             "): " + store_host() + " is gone or unreachable");
  }
}

}  // namespace ampactor::dist::detail
