// AsyncOptimizer's checkpoints: its masters (and spare weights) in an archive, checked against
// the live pipeline before anything changes; the archive operators; what save_run and load_run
// read of its privates (internal/run_access.h).
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/kernels/fused_step.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/pipeline/checkpoint.h>
#include "checkpoint/internal/sharded_files.h"
#include "internal/pipeline.h"
#include "internal/placement.h"
#include "internal/run_access.h"
#include "internal/shard_state.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/api/include/torch/serialize/input-archive.h>
#include <torch/csrc/api/include/torch/serialize/output-archive.h>

#include <c10/util/StringUtil.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace ampactor {

namespace {

constexpr std::int64_t format_version = 1;

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, "AsyncOptimizer checkpoint: " + why);
}

void write_list(torch::serialize::OutputArchive& archive, const char* key,
                const std::vector<at::Tensor>& ts) {
  torch::serialize::OutputArchive list(archive.compilation_unit());
  for (std::size_t i = 0; i < ts.size(); ++i)
    list.write(std::to_string(i), ts[i].detach(), /*is_buffer=*/true);
  archive.write(key, list);
}

enum class Need { required, optional };

/// The list `key` of `archive`, checked against `like` (count, shapes, dtypes) before anything
/// is changed. Empty if the archive has no such list and it is optional.
std::vector<at::Tensor> read_list(torch::serialize::InputArchive& archive, const char* key,
                                  const std::vector<at::Tensor>& like, Need need) {
  const bool required = need == Need::required;
  torch::serialize::InputArchive list;
  if (!archive.try_read(key, list)) {
    if (required) refuse(std::string("no '") + key + "' entry");
    return {};
  }
  std::vector<at::Tensor> out(like.size());
  for (std::size_t i = 0; i < like.size(); ++i) {
    if (!list.try_read(std::to_string(i), out[i], /*is_buffer=*/true))
      refuse(std::string(key) + " holds fewer than the " + std::to_string(like.size()) +
             " parameters of this pipeline (no tensor " + std::to_string(i) + ")");
    if (out[i].sizes() != like[i].sizes() || out[i].scalar_type() != like[i].scalar_type())
      refuse(std::string(key) + " " + std::to_string(i) + " is " +
             c10::toString(out[i].scalar_type()) + c10::str(out[i].sizes()) +
             ", this pipeline's is " + c10::toString(like[i].scalar_type()) +
             c10::str(like[i].sizes()));
  }
  at::Tensor extra;
  if (list.try_read(std::to_string(like.size()), extra, /*is_buffer=*/true))
    refuse(std::string(key) + " holds more than the " + std::to_string(like.size()) +
           " parameters of this pipeline");
  return out;
}

}  // namespace

namespace {

/// What a bit-for-bit resume also needs: the LibTorch thread counts of the trainer and the
/// optimizer thread (a matmul's or a reduction's blocking follows them) and the CPU kernels (the
/// fused steps' variant, ATen's capability override). Written with the checkpoint, compared on
/// load: a mismatch loads, with a warning.
std::string run_setup(GradScaler& scaler) {
  int optimizer_threads = 0;
  scaler.run_on_optimizer([&] { optimizer_threads = at::get_num_threads(); });
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  return "trainer threads " + std::to_string(at::get_num_threads()) + ", optimizer threads " +
         std::to_string(optimizer_threads) + ", fused steps " + kernels::fused_step_variant() +
         ", ATEN_CPU_CAPABILITY " + (cap ? cap : "unset");
}

}  // namespace

void AsyncOptimizer::save(torch::serialize::OutputArchive& archive) const {
  internal::Pipeline& p = *p_;
  p.scaler().run_on_optimizer([] {});  // every step in flight has run: the masters hold still
  archive.write("setup", c10::IValue(run_setup(p.scaler())));
  archive.write("format", c10::IValue(format_version));
  archive.write("staleness", c10::IValue(std::int64_t(p.options.staleness())));
  archive.write("weights_behind", c10::IValue(p.behind));
  // Sharded: which rank's shard of which layout these masters are.
  if (p.shard) archive.write("shard", c10::IValue(p.shard_text()));
  write_list(archive, "masters", p.masters);
  if (!p.spare.empty()) write_list(archive, "spare", p.spare);
}

void AsyncOptimizer::load(torch::serialize::InputArchive& archive) {
  p_->apply_load(p_->checked_load(archive));
}

namespace internal {

std::string Pipeline::shard_text() const {
  if (!shard) return "the whole state (unsharded)";
  return internal::shard_text(shard->rank(), shard->layout());
}

Pipeline::Loaded Pipeline::checked_load(torch::serialize::InputArchive& archive) const {
  c10::IValue format, behind;
  if (!archive.try_read("format", format) || !format.isInt())
    refuse("not a checkpoint written by AsyncOptimizer::save (no 'format' entry)");
  if (format.toInt() != format_version)
    refuse("format " + std::to_string(format.toInt()) + ", this version reads " +
           std::to_string(format_version));
  if (!archive.try_read("weights_behind", behind) || !behind.isBool())
    refuse("no 'weights_behind' entry");
  // A shard loads only into the same rank of the same layout (each rank saves and loads its own).
  c10::IValue shard;
  const std::string saved = archive.try_read("shard", shard) && shard.isString()
                                ? shard.toStringRef()
                                : "the whole state (unsharded)";
  if (saved != shard_text())
    refuse("it holds " + saved + ", this pipeline " + shard_text() +
           ": with shard_optimizer_state each rank saves and loads its own file, with the same "
           "ranks");
  // Everything is read and checked before anything changes.
  Loaded l;
  l.masters = read_list(archive, "masters", masters, Need::required);
  if (!spare.empty()) l.spare = read_list(archive, "spare", spare, Need::optional);
  l.weights_behind = behind.toBool();
  if (c10::IValue setup; archive.try_read("setup", setup) && setup.isString())
    l.setup = setup.toStringRef();
  return l;
}

void Pipeline::apply_load(const Loaded& l) {
  if (!l.setup.empty()) {
    const std::string here = run_setup(scaler());
    if (l.setup != here)
      std::cerr << "ampactor: this checkpoint was written with " << l.setup << "; this process has "
                << here << ". The run continues, but bit for bit only with the same ones.\n";
  }
  scaler().run_on_optimizer([&] {
    at::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < masters.size(); ++i)
      masters[i].detach().copy_(l.masters[i]);
    if (plan.swap) {
      // A checkpoint without spare weights (a sharded one never has them): the masters' cast,
      // which is what the spare holds.
      if (l.spare.empty())
        place->fill_spare(/*written=*/false);
      else
        for (std::size_t i = 0; i < spare.size(); ++i)
          spare[i].copy_(l.spare[i]);
    }
    if (!l.weights_behind) return;
    if (options.staleness() == 0)
      place->to_model();  // a synchronous pipeline's model always holds the newest weights
    else
      place->stage_loaded();  // the model on a GPU: the next step() brings them to it
  });
  behind = l.weights_behind && options.staleness() == 1;
}

}  // namespace internal

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const AsyncOptimizer& pipeline) {
  pipeline.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           AsyncOptimizer& pipeline) {
  pipeline.load(archive);
  return archive;
}

namespace internal {

bool RunAccess::sharded(const AsyncOptimizer& pipe) {
  return pipe.p_->shard != nullptr;
}
RankGroup& RunAccess::ranks(const AsyncOptimizer& pipe) {
  return pipe.p_->shard->ranks();
}
const ShardLayout& RunAccess::layout(const AsyncOptimizer& pipe) {
  return pipe.p_->shard->layout();
}
std::vector<std::vector<std::int64_t>> RunAccess::shapes(const AsyncOptimizer& pipe) {
  std::vector<std::vector<std::int64_t>> s;
  for (const at::Tensor& p : pipe.p_->model)
    s.emplace_back(p.sizes().begin(), p.sizes().end());
  return s;
}

}  // namespace internal
}  // namespace ampactor
