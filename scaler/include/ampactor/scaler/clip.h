// Clipping by the gradients' global 2-norm, with torch::nn::utils::clip_grad_norm_'s formula
// (coefficient max_norm / (total + 1e-6), at most 1), measured so that the total does not depend
// on the order in which the gradients were measured: each tensor's norm in fp32, their squares
// summed in double in parameter order. The pipelines clip before a fused step that unscales the
// gradients inside it, and the overlapped backward measures each bucket as it becomes ready.
#pragma once

#include <ampactor/core/shard_layout.h>

#include <ATen/core/Tensor.h>

#include <limits>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampactor {

/// The square of g's 2-norm (any float dtype): the norm in fp32 (in double where fp32
/// overflows), squared in double.
double squared_norm(const at::Tensor& g);
/// The 2-norm of `grads` times `mult`: the square root of the sum, in order, of each defined
/// gradient's squared_norm, or of `squares` (one per defined gradient) when made already.
double global_norm(const std::vector<at::Tensor>& grads, double mult,
                   const std::vector<double>* squares = nullptr);
/// sqrt of the sum, in order, of `squares`, times `mult`: global_norm's last step.
double norm_of_squares(const std::vector<double>& squares, double mult = 1.0);
/// Data parallel: the square of parameter `param`'s gradient g as a sharded state over `layout`
/// measures it, so that sharded and unsharded runs clip alike bit for bit: the sum, in flat
/// order, of the squared_norm of each piece the layout cuts it into. A parameter in one piece:
/// `measured` if that is a number, else squared_norm(g), as global_norm takes it.
double piece_square(const at::Tensor& g, const ShardLayout& layout, std::size_t param,
                    double measured = std::numeric_limits<double>::quiet_NaN());
/// clip_grad_norm_'s coefficient: max_norm / (total + 1e-6), at most 1.
double clip_coefficient(double total, double max_norm);
/// A fused step's inverse scale times the coefficient, rounded once; never 0 (a step refuses
/// it).
float clipped_inv_scale(float inv_scale, double coef);
/// torch's clip_grad_norm_(grads, max_norm) with the total measured as global_norm(grads, 1,
/// squares): the gradients are multiplied in place by the coefficient when it is below 1.
/// Returns the total.
double clip_grads_(const std::vector<at::Tensor>& grads, double max_norm,
                   const std::vector<double>* squares = nullptr);
/// The gradients of opt's parameters, in param-group order (undefined where none).
std::vector<at::Tensor> grads_of(const torch::optim::Optimizer& opt);

}  // namespace ampactor
