// AsyncOptimizer's checkpoints the LibTorch way: into a torch::serialize::OutputArchive beside
// the model, the optimizer and the scaler (AsyncOptimizer::save and load, and these operators).
#pragma once

#include <ampactor/checkpoint/checkpoint.h>

namespace ampactor {

class AsyncOptimizer;

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const AsyncOptimizer& pipeline);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           AsyncOptimizer& pipeline);

}  // namespace ampactor
