// Every registered message type through CAF's binary serializer and back, inside a caf::message
// (as it would cross to another node): each field comes back equal, which also checks that each
// type's inspect() names every field.
#include <doctest/doctest.h>

#include <ampactor/messages/config.h>
#include <ampactor/messages/messages.h>

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>

#include <string>
#include <tuple>
#include <vector>

using namespace ampactor;

namespace {

// Every field of each type, written out independently of inspect().
auto fields(const ScaleRequest& x) {
  return std::tie(x.k);
}
auto fields(const ScaleReply& x) {
  return std::tie(x.k, x.scale);
}
auto fields(const UnscaleDone& x) {
  return std::tie(x.k, x.optimizer, x.found_inf, x.scale_used, x.grad_max, x.dtype_max);
}
auto fields(const StepResult& x) {
  return std::tie(x.k, x.optimizer, x.found_inf, x.skipped, x.scale_used);
}
auto fields(const UpdateScale& x) {
  return std::tie(x.k, x.unscales);
}
auto fields(const UpdateApplied& x) {
  return std::tie(x.k, x.scale, x.growth_tracker, x.found_inf, x.backed_off, x.grew, x.abandoned,
                  x.halted, x.below_one);
}
auto fields(const ScaleParams& x) {
  return std::tie(x.applied_through, x.scale, x.growth_factor, x.backoff_factor, x.growth_interval,
                  x.growth_tracker);
}
auto fields(const GetParams& x) {
  return std::tie(x.up_to_date);
}
auto fields(const SetGrowthFactor& x) {
  return std::tie(x.value);
}
auto fields(const SetBackoffFactor& x) {
  return std::tie(x.value);
}
auto fields(const SetGrowthInterval& x) {
  return std::tie(x.value);
}
auto fields(const UpdateWhenClosed& x) {
  return std::tie(x.k);
}
auto fields(const SetScale& x) {
  return std::tie(x.k, x.new_scale, x.after_jobs);
}
auto fields(const StateDictMsg& x) {
  return std::tie(x.empty, x.scale, x.growth_factor, x.backoff_factor, x.growth_interval,
                  x.growth_tracker, x.has_hysteresis_tracker, x.hysteresis_tracker);
}
auto fields(const GetStateDict&) {
  return std::tuple<>();
}
auto fields(const LoadStateDict& x) {
  return fields(x.state);
}
auto fields(const IterationClosed& x) {
  return std::tie(x.k, x.unscales, x.abandoned);
}
auto fields(const CloseIteration& x) {
  return std::tie(x.k, x.report_unscales, x.inf_checks_required);
}
auto fields(const JobDone& x) {
  return std::tie(x.k, x.unscales);
}
auto fields(const std::vector<StepResult>& v) {
  std::vector<decltype(fields(v[0]))> out;
  for (const auto& s : v)
    out.push_back(fields(s));
  return out;
}
auto fields(const OverflowTensor& x) {
  return std::tie(x.name, x.index, x.inf, x.nan, x.neighbours_max);
}
auto fields(const std::vector<OverflowTensor>& v) {
  std::vector<decltype(fields(v[0]))> out;
  for (const auto& s : v)
    out.push_back(fields(s));
  return out;
}
auto fields(const IterationDone& x) {
  return std::make_tuple(x.k, fields(x.steps), x.failed, x.error_code, x.error_text,
                         x.cancelled_jobs, fields(x.overflow));
}

struct Rig {
  SystemConfig cfg;
  caf::actor_system sys{cfg.scheduler_threads(1)};
};

/// x inside a caf::message, serialized and read back as a caf::message.
template <class T>
T round_trip(Rig& rig, const T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink{rig.sys, buf};
  caf::message out = caf::make_message(x);
  const caf::error written = sink(out);
  REQUIRE_MESSAGE(!written, rig.sys.render(written));
  caf::message in;
  caf::binary_deserializer source{rig.sys, buf};
  const caf::error read = source(in);
  REQUIRE_MESSAGE(!read, rig.sys.render(read));
  REQUIRE(in.match_elements<T>());
  return in.get_as<T>(0);
}

std::vector<StepResult> two_steps() {
  return {StepResult{7, 0xabcdef12345ULL, true, true, 1024.5f},
          StepResult{7, 42, false, false, 3.0e-5f}};
}

}  // namespace

TEST_CASE("every registered message type round-trips through CAF's serializer, field by field") {
  Rig rig;
  int checked = 0;
  auto check = [&](const auto& x) {
    CAPTURE(checked);
    CHECK(fields(round_trip(rig, x)) == fields(x));
    ++checked;
  };
  check(ScaleRequest{-3});
  check(ScaleReply{9, 65536.0f});
  check(UnscaleDone{11, 0x1234567890ULL, true, 0.25f, 31744.5, 65504});
  check(two_steps()[0]);
  check(UpdateScale{12, 3});
  check(UpdateApplied{13, 0.5f, 1999, true, true, false, true, true, true});
  check(ScaleParams{14, 4096.0, 2.5, 0.125, 1 << 30, 17});
  check(GetParams{true});
  check(SetGrowthFactor{3.75});
  check(SetBackoffFactor{0.0625});
  check(SetGrowthInterval{2147483647});
  check(UpdateWhenClosed{15});
  check(SetScale{16, 1.0e30, true});  // every field off its default
  const StateDictMsg sd{false, 8192.0, 2.0, 0.5, 2000, 123, true, -2};
  check(sd);
  check(GetStateDict{});
  check(LoadStateDict{sd});
  check(IterationClosed{17, 2, true});
  check(CloseIteration{18, true, false});
  check(JobDone{19, 4});
  check(two_steps());
  const OverflowTensor held{"layers.3.weight", 0x1234567890ULL, true, true, 2.5e-7};
  check(held);
  IterationDone done{20,
                     two_steps(),
                     true,
                     errc::protocol_misuse,
                     "a job's error text",
                     3,
                     {held, OverflowTensor{"param 2", 2, false, true, 0.125}}};
  check(done);
  // One check per type register_messages registers: the "ampactor::" names (CAF adds its own
  // stream<T> and std::vector<T> for each) and std::vector<ampactor::StepResult>.
  std::size_t registered = 0;
  for (const auto& kv : rig.cfg.value_factories_by_name)
    registered += kv.first.rfind("ampactor::", 0) == 0;
  CHECK(rig.cfg.value_factories_by_name.count("std::vector<ampactor::StepResult>") == 1);
  CHECK(registered + 1 == std::size_t(checked));
}
