// consolidate_run and reshard_run: a run's checkpoint (sharded or not) read whole into one state
// per parameter, then written out cut along another layout. The masters and each per-element
// optimizer state tensor are cut; the step counts, the options, the model and the scaler are
// copied, and must agree across the shards.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>
#include "internal/archive_tree.h"
#include "internal/optimizer_file.h"
#include "internal/sharded_files.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

namespace ampactor {
namespace {

using internal::kOptimizerKind;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

[[noreturn]] void refuse(const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, why + "; nothing was written");
}

/// One parameter's optimizer state: its per-element tensors (flat, the whole parameter's) and
/// its other values (the step count), in the order the optimizer wrote them.
struct ParamState {
  bool present = false;
  std::vector<std::pair<std::string, c10::IValue>> values;
};

/// A whole run: the state of every parameter, whole, and what is copied as it is.
struct Run {
  std::int64_t step = 0;
  std::vector<std::int64_t> numels;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<at::Tensor> masters;  // flat
  std::vector<ParamState> state;
  std::vector<bool> seen;  // a piece of the parameter was read (its state's presence known)
  std::optional<internal::ArchiveNode> model, options;
  std::optional<StateDict> scaler;
  std::vector<std::pair<std::string, c10::IValue>> pipeline;  // format, staleness, setup...
  c10::IValue pytorch_version, kind;                          // the optimizer's format and kind
};

/// The entries of one run file that a re-shard reads.
struct File {
  InputArchive all, pipe, opt;
  std::vector<at::Tensor> masters;  // flat
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::optional<std::vector<std::pair<std::string, c10::IValue>>>> state;
};

void read_file(const std::string& path, File& f) {
  load_checkpoint(f.all, path);
  if (!f.all.try_read("pipeline", f.pipe) || !f.all.try_read("optimizer", f.opt))
    refuse("'" + path + "' holds no pipeline or no optimizer: save_run with both writes them");
  InputArchive list;
  if (!f.pipe.try_read("masters", list)) refuse("'" + path + "' holds no masters");
  for (std::size_t i = 0;; ++i) {
    at::Tensor t;
    if (!list.try_read(std::to_string(i), t, /*is_buffer=*/true)) break;
    f.shapes.emplace_back(t.sizes().begin(), t.sizes().end());
    f.masters.push_back(t.reshape({-1}));
  }
  at::Tensor groups;
  InputArchive param_groups;
  if (!f.opt.try_read("param_groups", param_groups) ||
      !param_groups.try_read("param_groups/size", groups) || groups.item<std::int64_t>() != 1)
    refuse("'" + path +
           "': the optimizer holds other than one parameter group (a re-shard cuts one group "
           "over the pipeline's optim_parameters())");
  InputArchive group, states;
  at::Tensor size;
  param_groups.try_read("param_groups/0", group);
  group.try_read("params/size", size);
  if (!f.opt.try_read("state", states) ||
      size.item<std::int64_t>() != std::int64_t(f.masters.size()))
    refuse("'" + path + "': the optimizer's group holds " +
           std::to_string(size.item<std::int64_t>()) + " parameters, the pipeline " +
           std::to_string(f.masters.size()) + " masters");
  for (std::size_t k = 0; k < f.masters.size(); ++k) {
    c10::IValue v;
    InputArchive st;
    if (!group.try_read("params/" + std::to_string(k), v) || !v.isString() ||
        !states.try_read(v.toStringRef(), st)) {
      f.state.emplace_back();  // no state yet (never stepped)
      continue;
    }
    std::vector<std::pair<std::string, c10::IValue>> values;
    for (const std::string& key : st.keys()) {
      c10::IValue x;
      st.try_read(key, x);
      values.emplace_back(key, x);
    }
    f.state.emplace_back(std::move(values));
  }
}

/// Piece `s` of `whole` (parameter s.param's elements, allocated like `like` on first use).
at::Tensor piece_of(at::Tensor& whole, const at::Tensor& like, std::int64_t numel,
                    const ShardPiece& s) {
  if (!whole.defined()) whole = at::empty({numel}, like.options());
  return whole.narrow(0, s.offset, s.length);
}

/// Merges piece `s` of file `f`'s master j (and its optimizer state) into the whole run.
void merge_piece(Run& run, const File& f, std::size_t j, const ShardPiece& s,
                 const std::string& who) {
  const std::string param = "parameter " + std::to_string(s.param);
  const std::int64_t numel = run.numels[s.param];
  const at::Tensor& m = f.masters[j];
  if (m.numel() != s.length)
    refuse(who + ": master " + std::to_string(j) + " holds " + std::to_string(m.numel()) +
           " elements, the layout's piece of " + param + " " + std::to_string(s.length));
  piece_of(run.masters[s.param], m, numel, s).copy_(m);
  ParamState& ps = run.state[s.param];
  const bool present = f.state[j].has_value();
  if (run.seen[s.param] && ps.present != present)
    refuse(who + ": " + param + " has optimizer state in some shards and not in others");
  const bool first = !run.seen[s.param];
  run.seen[s.param] = true;
  ps.present = present;
  if (!present) return;
  const auto& values = *f.state[j];
  if (first) ps.values.resize(values.size());
  if (values.size() != ps.values.size())
    refuse(who + ": " + param + "'s optimizer state has other entries than in another shard");
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto& [key, x] = values[i];
    auto& [whole_key, whole] = ps.values[i];
    if (first) whole_key = key;
    if (whole_key != key)
      refuse(who + ": " + param + "'s optimizer state has '" + key + "' where another shard has '" +
             whole_key + "'");
    if (x.isTensor()) {
      const at::Tensor t = x.toTensor().reshape({-1});
      if (t.numel() != s.length)
        refuse(who + ": the optimizer state '" + key + "' of " + param + " is not per element (" +
               std::to_string(t.numel()) + " elements, the piece " + std::to_string(s.length) +
               "), so it cannot be cut");
      at::Tensor w = first ? at::Tensor() : whole.toTensor();
      piece_of(w, t, numel, s).copy_(t);
      whole = w;
    } else if (first) {
      whole = x;
    } else if (whole != x) {
      refuse(who + ": " + param + "'s '" + key + "' differs between shards");
    }
  }
}

std::int64_t step_of(File& f, const std::string& who) {
  c10::IValue step;
  if (!f.all.try_read("step", step) || !step.isInt()) refuse(who + ": no step");
  return step.toInt();
}

/// What every file holds alike (the pipeline's settings, the model, the scaler, the optimizer's
/// options), from the first file; the step (run.step, set by the caller) and the scaler checked
/// in every one.
void merge_common(Run& run, File& f, const std::string& who, bool first) {
  if (const std::int64_t step = step_of(f, who); step != run.step)
    refuse(who + ": step " + std::to_string(step) + ", the manifest's " + std::to_string(run.step));
  std::optional<StateDict> scaler;
  if (InputArchive a; f.all.try_read("scaler", a)) scaler = read_state_dict(a);
  if (first) run.scaler = scaler;
  if (scaler != run.scaler) refuse(who + ": its scaler's state differs from rank 0's");
  if (!first) return;
  // The pipeline's values as save() wrote them, but its shard (the masters are lists).
  for (const std::string& key : f.pipe.keys()) {
    InputArchive list;
    c10::IValue v;
    if (key != "shard" && !f.pipe.try_read(key, list) && f.pipe.try_read(key, v))
      run.pipeline.emplace_back(key, v);
  }
  if (InputArchive a; f.all.try_read("model", a)) run.model = internal::read_node(a);
  InputArchive param_groups, group, options;
  f.opt.try_read("pytorch_version", run.pytorch_version);
  f.all.try_read(kOptimizerKind, run.kind);
  f.opt.try_read("param_groups", param_groups);
  param_groups.try_read("param_groups/0", group);
  if (group.try_read("options", options)) run.options = internal::read_node(options);
}

using Progress = std::function<void(const std::string&)>;

/// "PATH (N KiB)", or MiB from 1 MiB on, for progress lines.
std::string sized(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec) return path;
  const bool mib = bytes >= (1u << 20);
  return path + " (" + std::to_string((bytes + (mib ? 1u << 19 : 1u << 9)) >> (mib ? 20 : 10)) +
         (mib ? " MiB)" : " KiB)");
}

/// The run at `in` (a manifest and its shards, or one ordinary checkpoint), whole.
Run read_run(const std::string& in, const Progress& progress) {
  Run run;
  auto size = [&](const std::vector<std::int64_t>& numels) {
    run.numels = numels;
    run.masters.resize(numels.size());
    run.state.resize(numels.size());
    run.seen.assign(numels.size(), false);
  };
  if (is_manifest(in)) {
    const ShardManifest m = check_sharded_run(in);
    const ShardLayout layout = m.layout();
    size(m.numels);
    run.shapes = m.shapes;
    run.step = m.step;
    for (int r = 0; r < m.world; ++r) {
      const std::string path = m.shard_path(in, r);
      const std::string who = "rank " + std::to_string(r) + "'s shard '" + path + "'";
      File f;
      read_file(path, f);
      if (progress) progress("read rank " + std::to_string(r) + "'s shard " + sized(path));
      merge_common(run, f, who, /*first=*/r == 0);
      c10::IValue shard;
      if (!f.pipe.try_read("shard", shard) || !shard.isString() ||
          shard.toStringRef() != internal::shard_text(r, layout))
        refuse(who + " is not rank " + std::to_string(r) + "'s shard of " + layout.str());
      const std::vector<ShardPiece> pieces = layout.pieces(r);
      if (f.masters.size() != pieces.size())
        refuse(who + ": " + std::to_string(f.masters.size()) + " masters, the layout's " +
               std::to_string(pieces.size()) + " pieces");
      for (std::size_t j = 0; j < pieces.size(); ++j)
        merge_piece(run, f, j, pieces[j], who);
    }
  } else {
    File f;
    read_file(in, f);
    if (progress) progress("read " + sized(in));
    const std::string who = "'" + in + "'";
    run.step = step_of(f, who);
    if (c10::IValue shard; f.pipe.try_read("shard", shard))
      refuse(who + " holds one rank's shard: consolidate or re-shard the run from its manifest");
    merge_common(run, f, who, /*first=*/true);
    std::vector<std::int64_t> numels;
    for (const at::Tensor& m : f.masters)
      numels.push_back(m.numel());
    size(numels);
    run.shapes = f.shapes;
    for (std::size_t j = 0; j < f.masters.size(); ++j)
      merge_piece(run, f, j, ShardPiece{j, 0, numels[j]}, who);
  }
  // A parameter without elements has no piece in a layout: an empty master, no state.
  for (std::size_t p = 0; p < run.masters.size(); ++p)
    if (!run.masters[p].defined())
      for (const at::Tensor& m : run.masters)
        if (m.defined()) run.masters[p] = at::empty({0}, m.options());
  return run;
}

/// The run cut into `pieces` (one master each; `whole`: each a parameter, in its shape) at
/// `path`, with `shard` as the pipeline's shard entry ("" for none).
void write_run(const Run& run, const std::vector<ShardPiece>& pieces, bool whole,
               const std::string& shard, const std::string& path) {
  auto cut = [&](const at::Tensor& t, const ShardPiece& s) {
    if (!t.defined() || t.numel() == 0) return t;
    const at::Tensor c = t.narrow(0, s.offset, s.length);
    return whole ? c.view(run.shapes[s.param]) : c.clone();  // a clone: the piece's bytes alone
  };
  OutputArchive all;
  const auto cu = all.compilation_unit();
  OutputArchive pipe(cu), masters(cu), opt(cu), state(cu), param_groups(cu), group(cu);
  for (const auto& [key, value] : run.pipeline)
    pipe.write(key, value);
  if (!shard.empty()) pipe.write("shard", c10::IValue(shard));
  for (std::size_t j = 0; j < pieces.size(); ++j)
    masters.write(std::to_string(j), cut(run.masters[pieces[j].param], pieces[j]),
                  /*is_buffer=*/true);
  pipe.write("masters", masters);
  all.write("pipeline", pipe);
  if (run.model) internal::write_node(*run.model, all, "model");
  // LibTorch's optimizer archive: its state by key; its one group's parameters' keys, in order,
  // and options.
  opt.write("pytorch_version", run.pytorch_version);
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const ParamState& ps = run.state[pieces[j].param];
    if (!ps.present) continue;
    OutputArchive st(cu);
    for (const auto& [key, value] : ps.values)
      st.write(key, value.isTensor() ? c10::IValue(cut(value.toTensor(), pieces[j])) : value);
    state.write(std::to_string(j), st);
  }
  opt.write("state", state);
  param_groups.write("param_groups/size", at::scalar_tensor(std::int64_t(1), at::kLong));
  group.write("params/size", at::scalar_tensor(std::int64_t(pieces.size()), at::kLong));
  for (std::size_t j = 0; j < pieces.size(); ++j)
    group.write("params/" + std::to_string(j), c10::IValue(std::to_string(j)));
  if (run.options) internal::write_node(*run.options, group, "options");
  param_groups.write("param_groups/0", group);
  opt.write("param_groups", param_groups);
  all.write("optimizer", opt);
  if (run.kind.isString()) all.write(kOptimizerKind, run.kind);
  if (run.scaler) {
    OutputArchive scaler(cu);
    write_state_dict(*run.scaler, scaler);
    all.write("scaler", scaler);
  }
  all.write("step", c10::IValue(run.step));
  save_atomically(all, path);
}

}  // namespace

void consolidate_run(const std::string& manifest, const std::string& out,
                     const Progress& progress) {
  if (!is_manifest(manifest))
    refuse("'" + manifest + "' is not a sharded run's manifest (nothing to consolidate)");
  const Run run = read_run(manifest, progress);
  std::vector<ShardPiece> whole;
  for (std::size_t p = 0; p < run.numels.size(); ++p)
    whole.push_back(ShardPiece{p, 0, run.numels[p]});
  write_run(run, whole, /*whole=*/true, "", out);
  if (progress) progress("wrote " + sized(out));
}

void reshard_run(const std::string& in, int world, const std::string& out,
                 const Progress& progress) {
  if (world < 1)
    throw ScalerError(errc::bad_option,
                      "reshard_run: world must be at least 1, got " + std::to_string(world));
  const std::string base = std::filesystem::path(out).filename().string();
  if (base.empty() || base == "." || base == "..")
    throw ScalerError(errc::bad_option, "reshard_run: '" + out + "' names no file");
  const Run run = read_run(in, progress);
  // A rank per element at most: more would only write empty shards (2^31 of them, say).
  if (const std::int64_t total = ShardLayout(run.numels, 1).total();
      world > std::max<std::int64_t>(1, total))
    throw ScalerError(errc::bad_option, "reshard_run: world " + std::to_string(world) +
                                            " is more ranks than the run's " +
                                            std::to_string(total) + " elements");
  const ShardLayout layout(run.numels, world);
  ShardManifest m;
  m.step = run.step;
  m.numels = run.numels;
  m.world = world;
  m.granule = layout.granule();
  m.shapes = run.shapes;
  for (int r = 0; r < world; ++r) {
    ShardManifest::Shard s;
    s.rank = r;
    s.file = internal::shard_name(base, run.step, r, world);
    m.shards.push_back(s);
    const std::string path = m.shard_path(out, r);
    write_run(run, layout.pieces(r), /*whole=*/false, internal::shard_text(r, layout), path);
    m.shards.back().digest = file_digest(path, &m.shards.back().bytes);
    if (progress) progress("wrote rank " + std::to_string(r) + "'s shard " + sized(path));
  }
  save_text_atomically(m.to_json(), out);  // last: the manifest names whole shards only
}

}  // namespace ampactor
