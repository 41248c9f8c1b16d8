// GradScaler's checkpoints the LibTorch way: into a torch::serialize::OutputArchive beside the
// model and the optimizer, and torch::save(scaler, path) / torch::load(scaler, path) work (with
// <torch/serialize.h>). A whole run in one file: save_run and load_run (<ampactor/run/run.h>);
// the pipeline's archive operators: <ampactor/pipeline/checkpoint.h>.
//
// One archive for a whole run by hand (see examples/checkpoint_resume.cpp):
//   torch::serialize::OutputArchive all, model_ar, opt_ar, scaler_ar, pipe_ar;
//   pipeline.save(pipe_ar);  // first: waits for the steps in flight
//   model->save(model_ar), optimizer.save(opt_ar), scaler.save(scaler_ar);
//   all.write("model", model_ar) ... ; ampactor::save_atomically(all, path);
#pragma once

#include <ampactor/checkpoint/checkpoint.h>

namespace ampactor {

class GradScaler;

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler);

}  // namespace ampactor

// RunParts, save_run, load_run and resume_run were declared here before the run library had
// them: for one release this header still brings them (and the pipeline's operators) where
// their libraries are linked.
#if __has_include(<ampactor/run/run.h>)
#include <ampactor/run/run.h>
#endif
#if __has_include(<ampactor/pipeline/checkpoint.h>)
#include <ampactor/pipeline/checkpoint.h>
#endif
