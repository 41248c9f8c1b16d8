// Reading a trace's header line: the schema version, the policy and the scaler's options, checked
// as the scaler itself checks them.
#include <string>

#include "read_json.h"

namespace ampactor::trace_detail {

TraceHeader read_header(const json& j) {
  if (!j.is_object()) throw Bad("the header must be a JSON object, got " + json_kind(j));
  auto t = j.find("trace");
  if (t == j.end() || !t->is_string() || *t != "ampactor")
    throw Bad("not an ampactor trace: the header needs \"trace\": \"ampactor\"");
  Reader r{j, "header"};
  r.seen.emplace_back("trace");
  std::int64_t version = 0;
  r.integer("version", version);
  if (version < 1 || version > trace_schema_version)
    throw Bad("unsupported trace schema version " + std::to_string(version) +
              " (this build reads versions 1 to " + std::to_string(trace_schema_version) + ")");
  TraceHeader h;
  h.version = int(version);
  std::string policy;
  r("policy", policy);
  if (policy == "exact")
    h.policy = ScalePolicy::exact;
  else if (policy == "lagged")
    h.policy = ScalePolicy::lagged;
  else
    throw Bad("header.policy: expected \"exact\" or \"lagged\", got \"" + policy + "\"");
  const json& o = r.at("options");
  if (!o.is_object()) r.wrong("options", o, "an object");
  Reader ro{o, "header.options"};
  OptionValues values;
  values.apply(ro);
  RuleValues rule;
  if (o.contains("rule")) {
    if (version < 4) throw Bad("header.options: unknown field \"rule\" (since version 4)");
    const json& jr = ro.at("rule");
    if (!jr.is_object()) ro.wrong("rule", jr, "an object");
    Reader rr{jr, "header.options.rule"};
    rule.apply(rr);
    rr.done();
  }
  GuardValues guard;
  if (o.contains("guard")) {
    if (version < 7) throw Bad("header.options: unknown field \"guard\" (since version 7)");
    const json& jg = ro.at("guard");
    if (!jg.is_object()) ro.wrong("guard", jg, "an object");
    Reader rg{jg, "header.options.guard"};
    guard.apply(rg);
    rg.done();
  }
  ro.done();
  r.done();
  try {
    h.opts = values.options();
    rule.set(h.opts);
    guard.set(h.opts);
    h.opts.validate();
  } catch (const ScalerError& e) {
    throw Bad(std::string("header.options: ") + e.what());
  }
  return h;
}

}  // namespace ampactor::trace_detail
