#include <ampactor/keeper/taps.h>

#include <iostream>
#include <mutex>

#include <ampactor/core/errors.h>

namespace ampactor {

struct KeeperTaps::Dropped {
  std::mutex m;  // why's writes (the keeper's thread) and failure()'s reads (any thread)
  std::vector<std::string> why;  // "" while the tap runs
};

KeeperTaps::KeeperTaps(std::vector<std::shared_ptr<KeeperTap>> taps)
    : taps_(std::move(taps)), dropped_(std::make_unique<Dropped>()) {
  for (const auto& t : taps_)
    if (!t) throw ScalerError(errc::bad_option, "tee_taps: a tap is null");
  dropped_->why.resize(taps_.size());
}

KeeperTaps::~KeeperTaps() = default;

template <class F>
void KeeperTaps::each(F f) {
  for (std::size_t i = 0; i < taps_.size(); ++i) {
    if (!dropped_->why[i].empty()) continue;  // written on this thread only
    try {
      f(*taps_[i]);
    } catch (const std::exception& e) {
      const std::string why = std::string("tap dropped: ") + e.what();
      std::cerr << "ampactor: scale_keeper " << why << "\n";
      std::lock_guard<std::mutex> lock(dropped_->m);
      dropped_->why[i] = why;
    }
  }
}

void KeeperTaps::started(const GradScalerOptions& opts, ScalePolicy policy) {
  each([&](KeeperTap& t) { t.started(opts, policy); });
}
void KeeperTaps::input(peer_id from, const KeeperInput& in) {
  each([&](KeeperTap& t) { t.input(from, in); });
}
void KeeperTaps::output(const KeeperOutput& out) {
  each([&](KeeperTap& t) { t.output(out); });
}
void KeeperTaps::stopped() {
  each([](KeeperTap& t) { t.stopped(); });
}

std::string KeeperTaps::failure() const {
  for (std::size_t i = 0; i < taps_.size(); ++i) {
    {
      std::lock_guard<std::mutex> lock(dropped_->m);
      if (!dropped_->why[i].empty()) return dropped_->why[i];
    }
    std::string f = taps_[i]->failure();
    if (!f.empty()) return f;
  }
  return {};
}

std::shared_ptr<KeeperTaps> tee_taps(std::vector<std::shared_ptr<KeeperTap>> taps) {
  return std::make_shared<KeeperTaps>(std::move(taps));
}

}  // namespace ampactor
