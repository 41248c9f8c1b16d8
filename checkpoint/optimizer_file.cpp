// The optimizer part of a run file, checked before LibTorch reads it (internal/optimizer_file.h).
#include "internal/optimizer_file.h"

#include <ampactor/optim/fused.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace ampactor::internal {
namespace {

using torch::optim::OptimizerOptions;
using torch::serialize::InputArchive;

/// How an option is stored, and the range LibTorch's constructors accept.
enum class Type {
  nonneg,       // a double, finite and >= 0
  real,         // a double, finite
  flag,         // a bool
  betas,        // two doubles in [0, 1)
  count,        // an int > 0
  maybe_count,  // None or an int > 0
  maybe_text,   // None or a string
};

struct Kind {
  const char* name;
  std::vector<std::pair<const char*, Type>> options;
  std::function<std::unique_ptr<OptimizerOptions>(InputArchive&)> read;
};

template <class Options>
std::unique_ptr<OptimizerOptions> read_as(InputArchive& a) {
  auto o = std::make_unique<Options>(0.0);
  o->serialize(a);
  return o;
}

const std::vector<Kind>& kinds() {
  using T = Type;
  static const std::vector<std::pair<const char*, Type>> adam = {{"lr", T::nonneg},
                                                                 {"betas", T::betas},
                                                                 {"eps", T::nonneg},
                                                                 {"weight_decay", T::nonneg},
                                                                 {"amsgrad", T::flag}};
  static const std::vector<Kind> all = {
      {"Adam", adam, read_as<torch::optim::AdamOptions>},
      {"AdamW", adam, read_as<torch::optim::AdamWOptions>},  // the same options
      {"SGD",
       {{"lr", T::nonneg},
        {"momentum", T::nonneg},
        {"dampening", T::real},
        {"weight_decay", T::nonneg},
        {"nesterov", T::flag}},
       read_as<torch::optim::SGDOptions>},
      {"RMSprop",
       {{"lr", T::nonneg},
        {"alpha", T::nonneg},
        {"eps", T::nonneg},
        {"weight_decay", T::nonneg},
        {"momentum", T::nonneg},
        {"centered", T::flag}},
       read_as<torch::optim::RMSpropOptions>},
      {"Adagrad",
       {{"lr", T::nonneg},
        {"lr_decay", T::nonneg},
        {"weight_decay", T::nonneg},
        {"initial_accumulator_value", T::nonneg},
        {"eps", T::nonneg}},
       read_as<torch::optim::AdagradOptions>},
      {"LBFGS",
       {{"lr", T::nonneg},
        {"max_iter", T::count},
        {"max_eval", T::maybe_count},
        {"tolerance_grad", T::real},
        {"tolerance_change", T::real},
        {"history_size", T::count},
        {"line_search_fn", T::maybe_text}},
       read_as<torch::optim::LBFGSOptions>},
  };
  return all;
}

const Kind* kind_named(const std::string& name) {
  for (const Kind& k : kinds())
    if (name == k.name) return &k;
  return nullptr;
}

[[noreturn]] void fail(const std::string& why) {
  throw std::invalid_argument(why);
}

std::string number(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  return s.str();
}

/// Why option `key`'s value `v` is not one `type` allows; "" when it is.
std::string bad_value(const c10::IValue& v, Type type) {
  const auto real = [](const c10::IValue& x, bool nonneg, double below) -> std::string {
    if (!x.isDouble()) return "not a number";
    const double d = x.toDouble();
    if (!std::isfinite(d) || (nonneg && d < 0) || d >= below)
      return number(d) + (below < 2 ? ", outside [0, 1)" : nonneg ? ", not finite and >= 0" : "");
    return "";
  };
  switch (type) {
    case Type::nonneg:
      return real(v, true, INFINITY);
    case Type::real:
      return real(v, false, INFINITY);
    case Type::flag:
      return v.isBool() ? "" : "not a bool";
    case Type::betas: {
      if (!v.isTuple() || v.toTupleRef().elements().size() != 2) return "not a pair of numbers";
      for (const c10::IValue& b : v.toTupleRef().elements())
        if (std::string why = real(b, true, 1); !why.empty()) return why;
      return "";
    }
    case Type::count:
      return v.isInt() && v.toInt() > 0 ? "" : "not an integer > 0";
    case Type::maybe_count:
      return v.isNone() || (v.isInt() && v.toInt() > 0) ? "" : "not None or an integer > 0";
    case Type::maybe_text:
      return v.isNone() || v.isString() ? "" : "not None or a string";
  }
  return "";
}

/// The kind a file's options name (files written before the kind was recorded).
std::string told_from_options(InputArchive& options) {
  c10::IValue v;
  if (options.try_read("betas", v)) return "Adam or AdamW";
  for (const auto& [key, name] : {std::pair<const char*, const char*>{"nesterov", "SGD"},
                                  {"centered", "RMSprop"},
                                  {"lr_decay", "Adagrad"},
                                  {"max_iter", "LBFGS"}})
    if (options.try_read(key, v)) return name;
  return "";
}

std::int64_t size_in(InputArchive& a, const std::string& key) {
  at::Tensor t;
  if (!a.try_read(key, t) || !t.defined() || t.numel() != 1 ||
      !at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    return -1;
  return t.item<std::int64_t>();
}

std::string layout(const std::vector<std::int64_t>& sizes) {
  std::string s = std::to_string(sizes.size()) +
                  (sizes.size() == 1 ? " param group" : " param groups") + " (of ";
  for (std::size_t i = 0; i < sizes.size(); ++i)
    s += (i ? (i + 1 == sizes.size() ? " and " : ", ") : "") + std::to_string(sizes[i]);
  return s + (sizes.size() == 1 && sizes[0] == 1 ? " parameter)" : " parameters)");
}

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& opt) {
  namespace o = torch::optim;
  if (dynamic_cast<const o::Adam*>(&opt)) return "Adam";
  if (dynamic_cast<const o::AdamW*>(&opt)) return "AdamW";
  if (dynamic_cast<const o::SGD*>(&opt)) return "SGD";
  if (dynamic_cast<const o::RMSprop*>(&opt)) return "RMSprop";
  if (dynamic_cast<const o::Adagrad*>(&opt)) return "Adagrad";
  if (dynamic_cast<const o::LBFGS*>(&opt)) return "LBFGS";
  return "";
}

std::vector<std::unique_ptr<OptimizerOptions>> check_optimizer_file(
    InputArchive& opt_ar, const std::string& file_kind, const torch::optim::Optimizer& live) {
  const std::string kind = optimizer_kind(live);
  c10::IValue version;
  if (!opt_ar.try_read("pytorch_version", version) || !version.isString())
    fail("it has no format version (pytorch_version)");
  if (version.toStringRef() != "1.5.0")
    fail("its format version is '" + version.toStringRef() + "', LibTorch reads '1.5.0'");
  InputArchive groups;
  const std::int64_t n =
      opt_ar.try_read("param_groups", groups) ? size_in(groups, "param_groups/size") : -1;
  if (n < 0) fail("it has no param groups");
  std::vector<std::int64_t> file_sizes, live_sizes;
  std::vector<InputArchive> options(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    InputArchive g;
    const std::string at = "param_groups/" + std::to_string(i);
    const std::int64_t size = groups.try_read(at, g) ? size_in(g, "params/size") : -1;
    if (size < 0 || !g.try_read("options", options[std::size_t(i)]))
      fail("its param group " + std::to_string(i) + " has no parameter list or no options");
    file_sizes.push_back(size);
  }
  for (const auto& g : live.param_groups())
    live_sizes.push_back(std::int64_t(g.params().size()));
  // The kind first: another kind's layout says less than its name.
  const std::string file = !file_kind.empty() ? file_kind
                           : n > 0            ? told_from_options(options[0])
                                              : "";
  const bool same_kind = file.empty() || kind.empty() || file == kind ||
                         (file == "Adam or AdamW" && (kind == "Adam" || kind == "AdamW"));
  if (!same_kind) fail("the file holds " + file + "'s state, this optimizer is " + kind);
  if (file_sizes != live_sizes)
    fail("the file's optimizer has " + layout(file_sizes) + ", this one " + layout(live_sizes));
  std::vector<std::unique_ptr<OptimizerOptions>> out;
  const Kind* k = kind_named(kind);
  if (!k) return out;  // another optimizer: LibTorch's load alone
  for (std::size_t i = 0; i < options.size(); ++i) {
    for (const auto& [key, type] : k->options) {
      c10::IValue v;
      const std::string where = "param group " + std::to_string(i) + "'s option '" + key + "'";
      if (!options[i].try_read(key, v)) fail(where + " is missing (" + kind + " has it)");
      if (std::string why = bad_value(v, type); !why.empty()) fail(where + " is " + why);
    }
    out.push_back(k->read(options[i]));
  }
  return out;
}

std::vector<std::unique_ptr<OptimizerOptions>> group_options(const torch::optim::Optimizer& opt) {
  std::vector<std::unique_ptr<OptimizerOptions>> out;
  for (const auto& g : opt.param_groups())
    out.push_back(g.has_options() ? g.options().clone() : nullptr);
  return out;
}

void set_group_options(torch::optim::Optimizer& opt,
                       const std::vector<std::unique_ptr<OptimizerOptions>>& options) {
  auto& groups = opt.param_groups();
  for (std::size_t i = 0; i < groups.size() && i < options.size(); ++i)
    if (options[i]) groups[i].set_options(options[i]->clone());
}

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type();
  return s.str();
}

/// The state tensors of a parameter's optimizer state, where its type is known.
std::vector<at::Tensor> state_tensors(torch::optim::OptimizerParamState& s) {
  namespace o = torch::optim;
  if (auto* a = dynamic_cast<o::AdamParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<o::AdamWParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* g = dynamic_cast<o::SGDParamState*>(&s)) return {g->momentum_buffer()};
  if (auto* r = dynamic_cast<o::RMSpropParamState*>(&s))
    return {r->square_avg(), r->momentum_buffer(), r->grad_avg()};
  if (auto* a = dynamic_cast<o::AdagradParamState*>(&s)) return {a->sum()};
  return {};
}

}  // namespace

void check_optimizer_state(torch::optim::Optimizer& opt) {
  std::size_t i = 0;
  for (auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      if (torch::optim::OptimizerParamState* s = optim::param_state(opt, p))
        for (const at::Tensor& t : state_tensors(*s))
          if (t.defined() && (t.sizes() != p.sizes() || t.scalar_type() != p.scalar_type()))
            fail("the state of parameter " + std::to_string(i) + " is " + shape_of(t) +
                 ", the parameter " + shape_of(p));
      ++i;
    }
}

}  // namespace ampactor::internal
