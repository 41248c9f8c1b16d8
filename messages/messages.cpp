#include <ampactor/messages/config.h>
#include <ampactor/messages/messages.h>
#include <ampactor/messages/registry.h>

#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>

namespace ampactor {

caf::error make_error(errc code) {
  return caf::error(static_cast<std::uint8_t>(code), error_category);
}

caf::error make_error(errc code, const std::string& what) {
  return caf::error(static_cast<std::uint8_t>(code), error_category, caf::make_message(what));
}

ScalerError to_exception(const caf::error& e) {
  if (e.category() != error_category)
    return ScalerError(errc::step_failed, "actor error: " + caf::to_string(e));
  const auto code = static_cast<errc>(e.code());
  std::string text;
  if (e.context().match_elements<std::string>()) text = e.context().get_as<std::string>(0);
  return ScalerError(code, text.empty() ? std::string(to_string(code)) : text);
}

SystemConfig::SystemConfig() {
  register_messages(*this);
}

SystemConfig& SystemConfig::scheduler_threads(std::size_t n) {
  set("scheduler.max-threads", n);
  return *this;
}

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<ScaleRequest>("ampactor::ScaleRequest");
  cfg.add_message_type<ScaleReply>("ampactor::ScaleReply");
  cfg.add_message_type<UnscaleDone>("ampactor::UnscaleDone");
  cfg.add_message_type<StepResult>("ampactor::StepResult");
  cfg.add_message_type<UpdateScale>("ampactor::UpdateScale");
  cfg.add_message_type<UpdateApplied>("ampactor::UpdateApplied");
  cfg.add_message_type<ScaleParams>("ampactor::ScaleParams");
  cfg.add_message_type<GetParams>("ampactor::GetParams");
  cfg.add_message_type<SetGrowthFactor>("ampactor::SetGrowthFactor");
  cfg.add_message_type<SetBackoffFactor>("ampactor::SetBackoffFactor");
  cfg.add_message_type<SetGrowthInterval>("ampactor::SetGrowthInterval");
  cfg.add_message_type<UpdateWhenClosed>("ampactor::UpdateWhenClosed");
  cfg.add_message_type<SetScale>("ampactor::SetScale");
  cfg.add_message_type<StateDictMsg>("ampactor::StateDictMsg");
  cfg.add_message_type<GetStateDict>("ampactor::GetStateDict");
  cfg.add_message_type<LoadStateDict>("ampactor::LoadStateDict");
  cfg.add_message_type<IterationClosed>("ampactor::IterationClosed");
  cfg.add_message_type<CloseIteration>("ampactor::CloseIteration");
  cfg.add_message_type<JobDone>("ampactor::JobDone");
  cfg.add_message_type<std::vector<StepResult>>("std::vector<ampactor::StepResult>");
  cfg.add_message_type<OverflowTensor>("ampactor::OverflowTensor");
  cfg.add_message_type<std::vector<OverflowTensor>>("std::vector<ampactor::OverflowTensor>");
  cfg.add_message_type<IterationDone>("ampactor::IterationDone");
  cfg.add_error_category(
      error_category, [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
        std::string s = std::string("ampactor::") + to_string(static_cast<errc>(code));
        if (ctx.match_elements<std::string>()) s += ": " + ctx.get_as<std::string>(0);
        return s;
      });
}

}  // namespace ampactor
