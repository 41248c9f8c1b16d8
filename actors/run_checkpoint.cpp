// save_run / load_run: a whole training run in one checkpoint file, loaded whole or not at all.
#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/core/errors.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/optim/fused.h>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <functional>
#include <optional>
#include <sstream>
#include <vector>

namespace ampactor {
namespace {

[[noreturn]] void refuse(const std::string& part, const std::string& why) {
  throw ScalerError(errc::bad_checkpoint,
                    "load_run: " + part + ": " + why + "; nothing was changed");
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type();
  return s.str();
}

/// Module::load's walk, reading into fresh tensors and comparing each with the live one.
void check_module(torch::nn::Module& m, torch::serialize::InputArchive& archive,
                  const std::string& prefix) {
  auto check = [&](const std::string& key, const at::Tensor& live, bool buffer) {
    at::Tensor saved;
    if (!archive.try_read(key, saved, buffer) || !saved.defined())
      refuse("model", "no " + std::string(buffer ? "buffer " : "parameter ") + prefix + key);
    if (saved.sizes() != live.sizes() || saved.scalar_type() != live.scalar_type())
      refuse("model", prefix + key + " is " + shape_of(saved) + " in the file, " + shape_of(live) +
                          " in the model");
  };
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    check(p.key(), p.value(), false);
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    check(b.key(), b.value(), true);
  for (const auto& child : m.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive sub;
    if (!archive.try_read(child.key(), sub)) refuse("model", "no module " + prefix + child.key());
    check_module(*child.value(), sub, prefix + child.key() + ".");
  }
}

/// The state tensors of a parameter's optimizer state, where its type is known.
std::vector<at::Tensor> state_tensors(torch::optim::OptimizerParamState& s) {
  if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(&s))
    return {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()};
  if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(&s)) return {g->momentum_buffer()};
  return {};
}

/// Every known state tensor has its parameter's shape and dtype.
void check_optimizer_state(torch::optim::Optimizer& opt) {
  std::size_t i = 0;
  for (auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params()) {
      if (torch::optim::OptimizerParamState* s = optim::param_state(opt, p))
        for (const at::Tensor& t : state_tensors(*s))
          if (t.defined() && (t.sizes() != p.sizes() || t.scalar_type() != p.scalar_type()))
            refuse("optimizer", "the state of parameter " + std::to_string(i) + " is " +
                                    shape_of(t) + ", the parameter " + shape_of(p));
      ++i;
    }
}

/// Reads `key`'s sub-archive into `a` (an archive is not copyable in every library).
void part(torch::serialize::InputArchive& all, const char* key, torch::serialize::InputArchive& a) {
  if (!all.try_read(key, a)) refuse(key, "the file has no such part");
}

}  // namespace

void save_run(const std::string& path, const RunParts& parts, std::int64_t step) {
  torch::serialize::OutputArchive all;
  auto write = [&](const char* key,
                   const std::function<void(torch::serialize::OutputArchive&)>& f) {
    torch::serialize::OutputArchive a(all.compilation_unit());
    f(a);
    all.write(key, a);
  };
  // The pipeline first: it waits for the steps in flight, so the optimizer holds still.
  if (parts.pipeline()) write("pipeline", [&](auto& a) { parts.pipeline()->save(a); });
  if (parts.model()) write("model", [&](auto& a) { parts.model()->save(a); });
  if (parts.optimizer()) write("optimizer", [&](auto& a) { parts.optimizer()->save(a); });
  if (parts.scaler()) write("scaler", [&](auto& a) { parts.scaler()->save(a); });
  all.write("step", c10::IValue(step));
  save_atomically(all, path);
}

std::int64_t load_run(const std::string& path, const RunParts& parts) {
  torch::serialize::InputArchive all;
  load_checkpoint(all, path);  // screened: a damaged file changes nothing
  c10::IValue step;
  if (!all.try_read("step", step) || !step.isInt()) refuse("step", "the file has no step");
  // Everything ampactor can check, checked before anything changes.
  torch::serialize::InputArchive model_ar, opt_ar;
  if (parts.model()) {
    part(all, "model", model_ar);
    check_module(*parts.model(), model_ar, "");
  }
  if (parts.optimizer()) part(all, "optimizer", opt_ar);
  std::optional<StateDict> scaler_sd;
  if (parts.scaler()) {
    torch::serialize::InputArchive a;
    part(all, "scaler", a);
    try {
      scaler_sd = read_state_dict(a);
      ScaleState scratch(parts.scaler()->options());
      load_state_dict(scratch, *scaler_sd);  // the scaler's own refusals
    } catch (const ScalerError& e) {
      refuse("scaler", e.what());
    }
  }
  std::optional<AsyncOptimizer::Loaded> pipe_loaded;
  if (parts.pipeline()) {
    torch::serialize::InputArchive a;
    part(all, "pipeline", a);
    try {
      pipe_loaded = parts.pipeline()->checked_load(a);
    } catch (const ScalerError& e) {
      refuse("pipeline", e.what());
    }
  }
  // The optimizer only LibTorch reads: loaded from a snapshot-backed copy and checked after.
  // The pipeline waits for its steps first, so none writes the optimizer meanwhile.
  if (parts.pipeline()) parts.pipeline()->sync();
  std::stringstream opt_snapshot;
  if (parts.optimizer()) {
    torch::serialize::OutputArchive snap;
    parts.optimizer()->save(snap);
    snap.save_to(opt_snapshot);
    try {
      parts.optimizer()->load(opt_ar);
      check_optimizer_state(*parts.optimizer());
    } catch (const std::exception& e) {
      torch::serialize::InputArchive back;
      opt_snapshot.seekg(0);
      back.load_from(opt_snapshot);
      parts.optimizer()->load(back);
      if (dynamic_cast<const ScalerError*>(&e)) throw;
      refuse("optimizer", e.what());
    }
  }
  // The rest was checked: Module::load, the scaler's and the pipeline's loads take it as it is.
  // Should one throw all the same (a job's error), the parts already loaded are put back.
  std::vector<std::pair<at::Tensor, at::Tensor>> model_before;  // each tensor, its old storage
  std::optional<StateDict> scaler_before;
  try {
    if (parts.model()) {
      for (const at::Tensor& t : parts.model()->parameters())
        model_before.emplace_back(t, t.detach());
      for (const at::Tensor& t : parts.model()->buffers())
        model_before.emplace_back(t, t.detach());
      parts.model()->load(model_ar);
    }
    if (parts.scaler()) {
      scaler_before = parts.scaler()->state_dict();
      parts.scaler()->load_state_dict(*scaler_sd);
    }
    if (parts.pipeline()) parts.pipeline()->apply_load(*pipe_loaded);
  } catch (...) {
    torch::NoGradGuard no_grad;
    for (auto& [t, old] : model_before)
      at::Tensor(t).set_(old);
    if (scaler_before) parts.scaler()->load_state_dict(*scaler_before);
    if (parts.optimizer()) {
      torch::serialize::InputArchive back;
      opt_snapshot.seekg(0);
      back.load_from(opt_snapshot);
      parts.optimizer()->load(back);
    }
    throw;
  }
  return step.toInt();
}

}  // namespace ampactor
