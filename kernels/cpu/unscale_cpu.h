// The CPU body of unscale_and_check, check_finite and move_grads_and_unscale: the entry
// (kernels/unscale.cpp) checks every tensor and describes each as rows of strided elements; this
// cuts the rows into chunks and runs the instruction set's loops over them in parallel. No check
// here: what reaches it is valid.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "layout.h"
#include "loops.h"

namespace ampactor::kernels::cpu {

enum class Op { unscale, check, move };

/// One operand of a job: a base pointer, its element type and its layout slot.
struct Operand {
  char* base;
  ElemType type;
};

/// One tensor's part of a kernel call (a gradient, or a move's pair). A step job is JobContext.
struct TensorWork {
  Layout layout;
  Operand a;  // the gradient (or the model grad for a move)
  Operand b;  // the master grad for a move
};

/// Runs every job (`move`: operand a into b); returns whether any element was inf or NaN. With
/// `absmax`, a host Float tensor, raises it to the largest finite |element| read. With `flags`
/// (one byte per job), ORs kHeldInf / kHeldNaN (unscale.h) into the byte of each job that held
/// one: the chunks that found one are read again to tell which.
bool run_cpu(Op op, const std::vector<TensorWork>& jobs, float inv, at::Tensor* absmax,
             std::uint8_t* flags = nullptr);

}  // namespace ampactor::kernels::cpu
