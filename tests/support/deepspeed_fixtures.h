// The trajectories of DeepSpeed's own DynamicLossScaler (tests/fixtures/deepspeed, written by
// make_fixtures.py from the real package), read into plain values, and the check that a scaler
// follows one step by step. The suite is given the directory as AMPACTOR_DEEPSPEED_FIXTURES.
#pragma once

#include <ampactor/core/options.h>
#include <ampactor/core/state_dict.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace ampactor::test {

/// What a scaler did at one step: whether the update raised (DeepSpeed's error at its minimum),
/// and the scale and hysteresis after it.
struct DsStep {
  bool raised = false;
  double scale = 0;
  std::int64_t hysteresis = 0;
};

/// One DynamicLossScaler run: its settings, the schedule (true: an overflow) and what DeepSpeed
/// did at every step; `resumed` holds its attributes after step resume_at.
struct DsCase {
  std::string name;
  double init_scale = 0, min_scale = 0;
  std::int64_t scale_window = 0, delayed_shift = 0;
  bool consecutive_hysteresis = false, raise_error_at_min_scale = false;
  std::vector<bool> overflow;
  std::vector<DsStep> steps;
  std::size_t resume_at = 0;
  StateDict resumed;  // cur_scale, cur_iter, last_overflow_iter, ... (peer_state_dict's layout)

  /// ampactor's options for these settings.
  GradScalerOptions options() const {
    return GradScalerOptions::deepspeed()
        .init_scale(init_scale)
        .growth_interval(scale_window)
        .min_scale(min_scale)
        .hysteresis(delayed_shift)
        .consecutive_hysteresis(consecutive_hysteresis)
        .raise_at_min_scale(raise_error_at_min_scale);
  }
  /// Every scale DeepSpeed holds is a float (init_scale and min_scale are; the fixtures stay
  /// among normal floats): ampactor's float scale must then equal DeepSpeed's double itself.
  bool all_floats() const {
    return double(float(init_scale)) == init_scale && double(float(min_scale)) == min_scale;
  }
};

struct DsFixtures {
  std::string deepspeed_version, raise_text;
  std::vector<DsCase> cases;
};

inline double hex_double(const nlohmann::json& j) {
  return std::strtod(j.get<std::string>().c_str(), nullptr);
}

/// dynamic_loss_scaler.json, read once.
inline const DsFixtures& deepspeed_fixtures() {
  static const DsFixtures fixtures = [] {
    const std::string path = std::string(AMPACTOR_DEEPSPEED_FIXTURES) + "/dynamic_loss_scaler.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    const nlohmann::json doc = nlohmann::json::parse(in);
    DsFixtures f;
    f.deepspeed_version = doc.at("deepspeed_version").get<std::string>();
    f.raise_text = doc.at("raise_text").get<std::string>();
    for (const auto& j : doc.at("cases")) {
      DsCase c;
      c.name = j.at("name").get<std::string>();
      c.init_scale = hex_double(j.at("init_scale"));
      c.min_scale = hex_double(j.at("min_scale"));
      c.scale_window = j.at("scale_window").get<std::int64_t>();
      c.delayed_shift = j.at("delayed_shift").get<std::int64_t>();
      c.consecutive_hysteresis = j.at("consecutive_hysteresis").get<bool>();
      c.raise_error_at_min_scale = j.at("raise_error_at_min_scale").get<bool>();
      for (char o : j.at("overflow").get<std::string>())
        c.overflow.push_back(o == '1');
      c.steps.resize(c.overflow.size());
      for (std::size_t i = 0; i < c.steps.size(); ++i) {
        c.steps[i].scale = hex_double(j.at("scale").at(i));
        c.steps[i].hysteresis = j.at("cur_hysteresis").at(i).get<std::int64_t>();
      }
      for (const auto& i : j.at("raised"))
        c.steps.at(i.get<std::size_t>()).raised = true;
      c.resume_at = j.at("resume_at").get<std::size_t>();
      for (const auto& [key, v] : j.at("state_after_resume_at").items()) {
        if (v.is_string())
          c.resumed.set(key, hex_double(v));
        else
          c.resumed.set(key, v.get<std::int64_t>());
      }
      f.cases.push_back(std::move(c));
    }
    return f;
  }();
  return fixtures;
}

/// Drives `step` through c's schedule from step `from` on, and returns the first step whose
/// outcome is not DeepSpeed's (its raise, its hysteresis, and its scale: `exact`, the double
/// itself; otherwise the float it rounds to), or -1 when every step is.
inline long first_divergence(const DsCase& c, std::size_t from, bool exact,
                             const std::function<DsStep(bool)>& step) {
  for (std::size_t i = from; i < c.steps.size(); ++i) {
    const DsStep got = step(c.overflow[i]);
    const DsStep& want = c.steps[i];
    const bool scale_ok = exact ? got.scale == want.scale : float(got.scale) == float(want.scale);
    if (got.raised != want.raised || !scale_ok || got.hysteresis != want.hysteresis) return long(i);
  }
  return -1;
}

}  // namespace ampactor::test
