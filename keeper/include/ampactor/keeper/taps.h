// Several taps on one keeper (a keeper takes one): KeeperOptions().tap(ampactor::tee_taps({trace,
// metrics})). Each is told everything, in order; one that throws is dropped alone (with a line on
// stderr), the others go on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ampactor/keeper/keeper_core.h>

namespace ampactor {

class KeeperTaps final : public KeeperTap {
 public:
  /// Null taps are refused: ScalerError(errc::bad_option).
  explicit KeeperTaps(std::vector<std::shared_ptr<KeeperTap>> taps);
  ~KeeperTaps() override;
  void started(const GradScalerOptions& opts, ScalePolicy policy) override;
  void input(peer_id from, const KeeperInput& in) override;
  void output(const KeeperOutput& out) override;
  void stopped() override;
  /// The first failure of a tap (its own, or why it was dropped), or "".
  std::string failure() const override;
  const std::vector<std::shared_ptr<KeeperTap>>& taps() const { return taps_; }

 private:
  template <class F>
  void each(F f);
  std::vector<std::shared_ptr<KeeperTap>> taps_;
  struct Dropped;  // by tap, why it was dropped, and the lock failure() reads it under
  std::unique_ptr<Dropped> dropped_;
};

std::shared_ptr<KeeperTaps> tee_taps(std::vector<std::shared_ptr<KeeperTap>> taps);

}  // namespace ampactor
