// Checkpoints the LibTorch way for the whole library: the scalers and the asynchronous pipeline
// go into a torch::serialize::OutputArchive beside the model and the optimizer, and
// torch::save(scaler, path) / torch::load(scaler, path) work (with <torch/serialize.h>).
//
// One archive for a whole run (see examples/checkpoint_resume.cpp):
//   torch::serialize::OutputArchive all, model_ar, opt_ar, scaler_ar, pipe_ar;
//   pipeline.save(pipe_ar);  // first: waits for the steps in flight
//   model->save(model_ar), optimizer.save(opt_ar), scaler.save(scaler_ar);
//   all.write("model", model_ar) ... ; ampactor::save_atomically(all, path);
#pragma once

#include <ampactor/checkpoint/checkpoint.h>

namespace ampactor {

class GradScaler;
class AsyncOptimizer;

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler);
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const AsyncOptimizer& pipeline);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           AsyncOptimizer& pipeline);

}  // namespace ampactor
