// The CUDA branch of the public entry points, called once every check on the tensors has passed
// (kernels/cpu/*.cpp). dispatch_torch.cpp implements it where LibTorch has CUDA; elsewhere
// dispatch_stub.cpp reports why CUDA tensors cannot run. No CUDA headers here.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include <ampactor/core/update_rule.h>

namespace ampactor::kernels::internal {

/// Why CUDA tensors cannot run in this build, or nullptr when they can.
const char* cuda_unavailable_reason();

/// Unscale (or, with check_only, only check) CUDA gradients on the current stream. `inv_scale`
/// is a device tensor read by the kernel, or null to use `inv`. `grad_absmax` (a checked 1-element
/// fp32 device tensor, or null) is raised to the largest finite |gradient| read. `nonfinite` (a
/// checked Byte device tensor, one per gradient, or null): the attribution flags (unscale.h).
void cuda_unscale(const char* op, at::TensorList grads, const at::Tensor* inv_scale, float inv,
                  at::Tensor& found_inf, bool check_only, at::Tensor* grad_absmax,
                  at::Tensor* nonfinite = nullptr);

/// The fused grad move for CUDA model grads into CUDA fp32 masters, on the current stream.
void cuda_move(const char* op, at::TensorList model_grads, at::TensorList master_grads,
               const at::Tensor* inv_scale, float inv, at::Tensor& found_inf,
               at::Tensor* grad_absmax, at::Tensor* nonfinite = nullptr);

/// The one-thread scale update on the current stream.
void cuda_update_scale(const char* op, at::Tensor& scale, at::Tensor& growth_tracker,
                       const at::Tensor& found_inf, const ScaleRule& rule);

}  // namespace ampactor::kernels::internal
