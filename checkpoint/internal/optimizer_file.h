// The optimizer's part of a run file, checked by ampactor before LibTorch reads it: its kind, its
// param groups' layout and options. LibTorch 1.13's Optimizer::load drops the options and meets
// another kind's file with an assert and a backtrace; load_run restores the one and refuses the
// other by name.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <memory>
#include <string>
#include <vector>

namespace ampactor::internal {

/// The key of the run file's entry naming the optimizer's kind.
inline constexpr const char* kOptimizerKind = "optimizer_kind";

/// "Adam", "AdamW", "SGD", "RMSprop", "Adagrad" or "LBFGS" (the fused ones are their base's
/// kind: the same file format); "" for another optimizer, whose file is not checked.
std::string optimizer_kind(const torch::optim::Optimizer& opt);

/// The optimizer part `opt_ar` of a file whose recorded kind is `file_kind` ("" where the file
/// predates it: then told from the options' names), checked against `live`: the same kind, as
/// many param groups of as many parameters, every option there and in its range. Returns each
/// group's options as read; throws the reason, naming both sides, else.
std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> check_optimizer_file(
    torch::serialize::InputArchive& opt_ar, const std::string& file_kind,
    const torch::optim::Optimizer& live);

/// Each param group's options, copied (to put back).
std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> group_options(
    const torch::optim::Optimizer& opt);
/// Each param group's options set to `options` (one per group, as check_optimizer_file returns).
void set_group_options(torch::optim::Optimizer& opt,
                       const std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& options);

/// Every state tensor of every parameter has its parameter's shape and dtype; throws else.
void check_optimizer_state(torch::optim::Optimizer& opt);

}  // namespace ampactor::internal
