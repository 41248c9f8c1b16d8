// save_run / load_run: a whole training run in one checkpoint file, loaded whole or not at all.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include <ampactor/core/scale_state.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/run/run.h>
#include <ampactor/scaler/ranks.h>
#include "checkpoint/internal/optimizer_file.h"
#include "internal/sharded_run.h"

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
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

/// Module::load's walk, reading into fresh tensors and comparing each with the live one; each
/// saved tensor's name and digest appended to `digests` (what ranks compare: their files' bytes
/// differ, since a file names itself inside).
void check_module(torch::nn::Module& m, torch::serialize::InputArchive& archive,
                  const std::string& prefix, std::string& digests) {
  auto check = [&](const std::string& key, const at::Tensor& live, bool buffer) {
    at::Tensor saved;
    if (!archive.try_read(key, saved, buffer) || !saved.defined())
      refuse("model", "no " + std::string(buffer ? "buffer " : "parameter ") + prefix + key);
    if (saved.sizes() != live.sizes() || saved.scalar_type() != live.scalar_type())
      refuse("model", prefix + key + " is " + shape_of(saved) + " in the file, " + shape_of(live) +
                          " in the model");
    const at::Tensor bytes = saved.contiguous();
    digests += prefix + key + " " +
               internal::bytes_digest(static_cast<const char*>(bytes.data_ptr()),
                                      std::size_t(bytes.nbytes())) +
               "\n";
  };
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    check(p.key(), p.value(), /*buffer=*/false);
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    check(b.key(), b.value(), /*buffer=*/true);
  for (const auto& child : m.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive sub;
    if (!archive.try_read(child.key(), sub)) refuse("model", "no module " + prefix + child.key());
    check_module(*child.value(), sub, prefix + child.key() + ".", digests);
  }
}

using OptionsList = std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>;

/// The optimizer as its snapshot and its groups' options hold it.
void restore_optimizer(const RunParts& parts, std::stringstream& snapshot,
                       const OptionsList& options) {
  torch::serialize::InputArchive back;
  snapshot.clear();
  snapshot.seekg(0);
  back.load_from(snapshot);
  parts.optimizer()->load(back);
  internal::set_group_options(*parts.optimizer(), options);
}

/// LibTorch's reason, without its backtrace or its request to report a bug: the file's layout
/// is not what this optimizer's load reads.
std::string libtorch_reason(const std::exception& e, const std::string& kind) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string m = c ? c->msg() : e.what();
  if (m.find("INTERNAL ASSERT FAILED") != std::string::npos || m.find('\n') != std::string::npos)
    m = m.substr(0, std::min(m.find('\n'), m.find(" INTERNAL ASSERT FAILED")));
  return "LibTorch cannot read it as " + (kind.empty() ? "this optimizer" : kind) + "'s (" + m +
         ")";
}

/// Reads `key`'s sub-archive into `a` (an archive is not copyable in every library).
void part(torch::serialize::InputArchive& all, const char* key, torch::serialize::InputArchive& a) {
  if (!all.try_read(key, a)) refuse(key, "the file has no such part");
}

/// The run's parts and `step` in `all`, as save_run writes them.
void run_archive(const RunParts& parts, std::int64_t step, torch::serialize::OutputArchive& all) {
  auto write = [&](const char* key,
                   const std::function<void(torch::serialize::OutputArchive&)>& f) {
    torch::serialize::OutputArchive a(all.compilation_unit());
    f(a);
    all.write(key, a);
  };
  // The pipeline first: it waits for the steps in flight, so the optimizer holds still.
  if (parts.pipeline()) write("pipeline", [&](auto& a) { parts.pipeline()->save(a); });
  if (parts.model()) write("model", [&](auto& a) { parts.model()->save(a); });
  if (parts.optimizer()) {
    write("optimizer", [&](auto& a) { parts.optimizer()->save(a); });
    // LibTorch's file does not say which optimizer wrote it (Adam's and AdamW's look alike).
    if (const std::string k = internal::optimizer_kind(*parts.optimizer()); !k.empty())
      all.write(internal::kOptimizerKind, c10::IValue(k));
  }
  if (parts.scaler()) write("scaler", [&](auto& a) { parts.scaler()->save(a); });
  all.write("step", c10::IValue(step));
}

void save_run_file(const std::string& path, const RunParts& parts, std::int64_t step) {
  torch::serialize::OutputArchive all;
  run_archive(parts, step, all);
  save_atomically(all, path);
}

/// The file save_run_file writes, as bytes.
std::string run_bytes(const RunParts& parts, std::int64_t step) {
  torch::serialize::OutputArchive all;
  run_archive(parts, step, all);
  std::string bytes;
  all.save_to([&](const void* data, std::size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

bool sharded(const RunParts& parts) {
  return parts.pipeline() && internal::RunAccess::sharded(*parts.pipeline());
}

/// What load_run_file reads and checks before it changes anything.
struct Checked {
  torch::serialize::InputArchive model_ar;
  std::optional<StateDict> scaler_sd;
  std::optional<internal::RunAccess::Loaded> pipe_loaded;
  std::stringstream opt_snapshot;               // the optimizer as it was, once its load was tried
  OptionsList opt_options_before, opt_options;  // its groups' options, before and in the file
  std::int64_t step = 0;
  std::string model_digests;  // check_module's: a line per tensor
};

/// The optimizer's part into `opt_ar`, checked against the live optimizer before any load (its
/// kind, groups and options); the groups' options as read kept, for LibTorch 1.13 drops them.
void check_optimizer_part(torch::serialize::InputArchive& all, const RunParts& parts,
                          torch::serialize::InputArchive& opt_ar, Checked& c) {
  part(all, "optimizer", opt_ar);
  c10::IValue kind;
  if (all.try_read(internal::kOptimizerKind, kind) && !kind.isString())
    refuse("optimizer", "its kind is not a name");
  try {
    c.opt_options = internal::check_optimizer_file(
        opt_ar, kind.isString() ? kind.toStringRef() : "", *parts.optimizer());
  } catch (const std::invalid_argument& e) {
    refuse("optimizer", e.what());
  }
}

/// The scaler's part, loaded into a scratch state: the scaler's own refusals, the live scaler
/// left as it is.
void check_scaler_part(torch::serialize::InputArchive& all, const RunParts& parts, Checked& c) {
  torch::serialize::InputArchive a;
  part(all, "scaler", a);
  try {
    c.scaler_sd = read_state_dict(a);
    ScaleState scratch(parts.scaler()->options());
    load_state_dict(scratch, *c.scaler_sd);  // the scaler's own refusals
  } catch (const ScalerError& e) {
    refuse("scaler", e.what());
  }
}

/// The pipeline's part, checked by the pipeline and kept, to apply once everything has passed.
void check_pipeline_part(torch::serialize::InputArchive& all, const RunParts& parts, Checked& c) {
  torch::serialize::InputArchive a;
  part(all, "pipeline", a);
  try {
    c.pipe_loaded = internal::RunAccess::checked_load(*parts.pipeline(), a);
  } catch (const ScalerError& e) {
    refuse("pipeline", e.what());
  }
}

/// The optimizer loaded from `opt_ar` (only LibTorch reads it) and checked after: a snapshot taken
/// first puts it back on an error.
void load_optimizer_checked(const RunParts& parts, torch::serialize::InputArchive& opt_ar,
                            Checked& c) {
  torch::serialize::OutputArchive snap;
  parts.optimizer()->save(snap);
  snap.save_to(c.opt_snapshot);
  c.opt_options_before = internal::group_options(*parts.optimizer());
  try {
    try {
      parts.optimizer()->load(opt_ar);
    } catch (const std::exception& e) {
      throw std::invalid_argument(libtorch_reason(e, internal::optimizer_kind(*parts.optimizer())));
    }
    internal::check_optimizer_state(*parts.optimizer());
    // LibTorch 1.13's load reads each group's options and drops them.
    internal::set_group_options(*parts.optimizer(), c.opt_options);
  } catch (const std::exception& e) {
    restore_optimizer(parts, c.opt_snapshot, c.opt_options_before);
    if (dynamic_cast<const ScalerError*>(&e)) throw;
    refuse("optimizer", e.what());
  }
}

/// Everything ampactor can check of the file at `path`, checked; the optimizer, which only
/// LibTorch reads, loaded from a snapshot-backed copy and checked after (put back on an error).
void check_run(const std::string& path, const RunParts& parts, Checked& c) {
  torch::serialize::InputArchive all;
  load_checkpoint(all, path);  // screened: a damaged file changes nothing
  c10::IValue step;
  if (!all.try_read("step", step) || !step.isInt()) refuse("step", "the file has no step");
  c.step = step.toInt();
  torch::serialize::InputArchive opt_ar;
  if (parts.model()) {
    part(all, "model", c.model_ar);
    check_module(*parts.model(), c.model_ar, "", c.model_digests);
  }
  if (parts.optimizer()) check_optimizer_part(all, parts, opt_ar, c);
  if (parts.scaler()) check_scaler_part(all, parts, c);
  if (parts.pipeline()) check_pipeline_part(all, parts, c);
  // The pipeline waits for its steps first, so none writes the optimizer meanwhile (a sharded
  // one did, before its ranks read their shards: its sync is a collective).
  if (parts.pipeline() && !sharded(parts)) parts.pipeline()->sync();
  if (parts.optimizer()) load_optimizer_checked(parts, opt_ar, c);
}

/// load_run of one file. With `agreed` (ranks), this rank's error, or "" with the file's step and
/// model digest once everything is checked, goes to agreed, which throws on every rank if any rank
/// has one.
std::int64_t load_run_file(const std::string& path, const RunParts& parts,
                           const internal::AgreeFn& agreed) {
  Checked c;
  bool tried_optimizer = false;
  try {
    check_run(path, parts, c);
    tried_optimizer = parts.optimizer() != nullptr;
  } catch (const std::exception& e) {  // any: the other ranks must hear of it, not wait
    if (!agreed) throw;
    agreed(e.what(), -1, "");  // throws
    throw;
  }
  if (agreed) try {
      agreed("", c.step, internal::bytes_digest(c.model_digests.data(), c.model_digests.size()));
    } catch (...) {
      if (tried_optimizer) restore_optimizer(parts, c.opt_snapshot, c.opt_options_before);
      throw;
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
      parts.model()->load(c.model_ar);
    }
    if (parts.scaler()) {
      scaler_before = parts.scaler()->state_dict();
      parts.scaler()->load_state_dict(*c.scaler_sd);
    }
    if (parts.pipeline()) internal::RunAccess::apply_load(*parts.pipeline(), *c.pipe_loaded);
  } catch (...) {
    torch::NoGradGuard no_grad;
    for (auto& [t, old] : model_before)
      at::Tensor(t).set_(old);
    if (scaler_before) parts.scaler()->load_state_dict(*scaler_before);
    if (parts.optimizer()) restore_optimizer(parts, c.opt_snapshot, c.opt_options_before);
    throw;
  }
  return c.step;
}

/// load_run of one file on every rank of a group: each rank's copy must be there, pass the
/// checks and hold the same step and model (its tensors' digest) before any rank changes; else
/// every rank refuses, naming the rank. A rank that resumed alone would average its steps with
/// another step's on the others, silently.
std::int64_t load_run_agreed(const std::string& path, const RunParts& parts, RankGroup& ranks) {
  const std::string head = "load_run '" + path + "': ";
  const std::string fix =
      ", so no rank loaded (every rank needs the same checkpoint: on several hosts, copy it to "
      "each or keep it on a shared file system)";
  return load_run_file(
      path, parts, [&](const std::string& error, std::int64_t step, const std::string& digest) {
        const std::string mine = error.empty()
                                     ? "step " + std::to_string(step) + " (model " + digest + ")"
                                     : std::string(1, '\0') + error;
        const std::vector<std::string> all = internal::gather_strings(ranks, mine);
        for (std::size_t r = 0; r < all.size(); ++r)
          if (!all[r].empty() && all[r][0] == '\0')
            throw ScalerError(errc::bad_checkpoint, head + "rank " + std::to_string(r) +
                                                        " cannot load it (" + all[r].substr(1) +
                                                        ")" + fix);
        for (std::size_t r = 1; r < all.size(); ++r)
          if (all[r] != all[0])
            throw ScalerError(errc::bad_checkpoint, head + "rank " + std::to_string(r) + " has " +
                                                        all[r] + ", rank 0 has " + all[0] + fix);
      });
}

}  // namespace

void save_run(const std::string& path, const RunParts& parts, std::int64_t step) {
  if (!sharded(parts)) return save_run_file(path, parts, step);
  internal::save_sharded_run(path, parts, step, [&] { return run_bytes(parts, step); });
}

std::int64_t load_run(const std::string& path, const RunParts& parts) {
  if (sharded(parts))
    return internal::load_sharded_run(path, parts,
                                      [&](const std::string& file, const auto& agreed) {
                                        return load_run_file(file, parts, agreed);
                                      });
  if (is_manifest(path))
    refuse("file", "'" + path +
                       "' is a sharded run's manifest: load it on its number of ranks with "
                       "shard_optimizer_state, or make one checkpoint of it with ampactor-ckpt "
                       "consolidate");
  if (const auto ranks = parts.scaler() ? parts.scaler()->options().ranks() : nullptr;
      ranks && ranks->size() > 1)
    return load_run_agreed(path, parts, *ranks);
  return load_run_file(path, parts, nullptr);
}

std::int64_t resume_run(const std::string& path, const RunParts& parts) {
  const bool here = ::access(path.c_str(), F_OK) == 0;
  RankGroup* ranks = sharded(parts)   ? &internal::RunAccess::ranks(*parts.pipeline())
                     : parts.scaler() ? parts.scaler()->options().ranks().get()
                                      : nullptr;
  if (!ranks || ranks->size() == 1) return here ? load_run(path, parts) : -1;
  // One decision for all ranks: load_run is a collective, which no rank may enter alone.
  const std::vector<std::string> all = internal::gather_strings(*ranks, here ? "1" : "0");
  // A sharded run's manifest is rank 0's to read; the other ranks need their shards only.
  if (sharded(parts)) return all[0] == "1" ? load_run(path, parts) : -1;
  std::vector<int> with, without;
  for (std::size_t r = 0; r < all.size(); ++r)
    (all[r] == "1" ? with : without).push_back(int(r));
  if (with.empty()) return -1;
  if (without.empty()) return load_run(path, parts);
  const auto names = [](const std::vector<int>& rs) {
    std::string s = rs.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < rs.size(); ++i)
      s += (i ? ", " : "") + std::to_string(rs[i]);
    return s;
  };
  throw ScalerError(errc::bad_checkpoint,
                    "resume_run '" + path + "': " + names(with) +
                        (with.size() == 1 ? " has it, " : " have it, ") + names(without) +
                        (without.size() == 1 ? " does not" : " do not") +
                        ", so no rank loaded (copy it to every host, keep it on a shared "
                        "file system, or remove it to start afresh)");
}

}  // namespace ampactor
