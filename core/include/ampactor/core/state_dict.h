// The scaler's state_dict as a value, with torch's keys:
// scale, growth_factor, backoff_factor (floats), growth_interval, _growth_tracker (ints).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include <ampactor/core/scale_state.h>

namespace ampactor {

class StateDict {
 public:
  using Value = std::variant<double, std::int64_t>;

  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }
  bool contains(const std::string& key) const { return items_.count(key) != 0; }
  void set(const std::string& key, Value v) { items_[key] = v; }
  void erase(const std::string& key) { items_.erase(key); }
  const Value& at(const std::string& key) const { return items_.at(key); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

  /// A float entry (an int is accepted and converted, as Python would). Throws
  /// ScalerError(bad_state_dict) naming the key when it is missing.
  double get_double(const std::string& key) const;
  /// An int entry; a float is refused with ScalerError(bad_state_dict).
  std::int64_t get_int(const std::string& key) const;

  bool operator==(const StateDict& o) const { return items_ == o.items_; }
  bool operator!=(const StateDict& o) const { return items_ != o.items_; }

 private:
  std::map<std::string, Value> items_;
};

/// The dict of an enabled scaler in `state`.
StateDict make_state_dict(const ScaleState& state);

/// Checks every key, type and value of `sd`, then loads it into `state`; on any error throws
/// ScalerError and leaves `state` unchanged. An empty dict gives torch's empty_state_dict error.
void load_state_dict(ScaleState& state, const StateDict& sd);

}  // namespace ampactor
