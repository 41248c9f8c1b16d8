#include <ampactor/keeper/taps.h>

#include <iostream>

#include <ampactor/core/errors.h>

namespace ampactor {

KeeperTaps::KeeperTaps(std::vector<std::shared_ptr<KeeperTap>> taps) : taps_(std::move(taps)) {
  for (const auto& t : taps_)
    if (!t) throw ScalerError(errc::bad_option, "tee_taps: a tap is null");
  dropped_.resize(taps_.size());
}

template <class F>
void KeeperTaps::each(F f) {
  for (std::size_t i = 0; i < taps_.size(); ++i) {
    if (!dropped_[i].empty()) continue;
    try {
      f(*taps_[i]);
    } catch (const std::exception& e) {
      const std::string why = std::string("tap dropped: ") + e.what();
      std::cerr << "ampactor: scale_keeper " << why << "\n";
      std::lock_guard<std::mutex> lock(m_);
      dropped_[i] = why;
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
      std::lock_guard<std::mutex> lock(m_);
      if (!dropped_[i].empty()) return dropped_[i];
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
