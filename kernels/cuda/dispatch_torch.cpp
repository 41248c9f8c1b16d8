// The CUDA branch with a CUDA-enabled LibTorch: tensors become spans of device memory and the
// kernels run on the current stream of the tensors' device, with no host synchronisation.
// Dense tensors (contiguous, transposed, any permutation) are passed as they lie in memory.
// Tensors that are not dense (slices) go through a contiguous temporary, queued on the same
// stream: copied in, processed, and copied back where they are written. The caching allocator
// reuses a temporary's memory only for later work on that stream, so dropping it here is safe.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <ampactor/core/errors.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "launch.h"

namespace ampactor::kernels::internal {
namespace {

gpu::DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble:
      return gpu::DType::f64;
    case at::kHalf:
      return gpu::DType::f16;
    case at::kBFloat16:
      return gpu::DType::bf16;
    default:  // the entry points have refused every other dtype
      return gpu::DType::f32;
  }
}

void* current_stream(const at::Tensor& on) {
  return c10::cuda::getCurrentCUDAStream(on.device().index()).stream();
}

// Input a launcher refuses is the same misuse the CPU path reports as invalid_gradients; any other
// status is a failure of the CUDA runtime.
void check_status(const char* op, int status) {
  if (status == 0) return;
  const std::string what = std::string("ampactor::") + op + ": CUDA: " + gpu::error_string(status);
  if (status == gpu::kInvalidInput) throw ScalerError(errc::invalid_gradients, what);
  throw std::runtime_error(what);
}

gpu::Attribution attribution(at::Tensor* nonfinite, const std::vector<std::uint32_t>& slots) {
  return nonfinite ? gpu::Attribution{nonfinite->data_ptr<std::uint8_t>(), slots.data()}
                   : gpu::Attribution{};
}

}  // namespace

const char* cuda_unavailable_reason() {
  return nullptr;  // a CUDA tensor exists, so LibTorch found a device
}

void cuda_unscale(const char* op, at::TensorList grads, const at::Tensor* inv_scale, float inv,
                  at::Tensor& found_inf, bool check_only, at::Tensor* grad_absmax,
                  at::Tensor* nonfinite) {
  const c10::cuda::CUDAGuard guard(found_inf.device());
  void* stream = current_stream(found_inf);
  std::vector<gpu::Span> spans;
  std::vector<std::uint32_t> slots;                           // span i is gradient slots[i]
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;  // (gradient, its temporary)
  std::vector<at::Tensor> temps;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (g.numel() == 0) continue;
    slots.push_back(std::uint32_t(i));
    at::Tensor run = g;
    if (!g.is_non_overlapping_and_dense()) {
      run = g.contiguous();
      if (check_only)
        temps.push_back(run);
      else
        write_back.emplace_back(g, run);
    }
    spans.push_back({run.data_ptr(), run.numel(), dtype_of(g)});
  }
  // A temporary holds the same values as its gradient, so its max is the gradient's.
  float* absmax = grad_absmax ? grad_absmax->data_ptr<float>() : nullptr;
  const int status =
      check_only
          ? gpu::check_finite(spans.data(), spans.size(), found_inf.data_ptr<float>(), stream,
                              absmax, attribution(nonfinite, slots))
          : gpu::unscale_and_check(
                spans.data(), spans.size(), inv_scale ? inv_scale->data_ptr<float>() : nullptr, inv,
                found_inf.data_ptr<float>(), stream, absmax, attribution(nonfinite, slots));
  check_status(op, status);
  for (auto& [grad, temp] : write_back)
    grad.copy_(temp);
}

void cuda_move(const char* op, at::TensorList model_grads, at::TensorList master_grads,
               const at::Tensor* inv_scale, float inv, at::Tensor& found_inf,
               at::Tensor* grad_absmax, at::Tensor* nonfinite) {
  const c10::cuda::CUDAGuard guard(found_inf.device());
  void* stream = current_stream(found_inf);
  std::vector<gpu::MoveSpan> spans;
  std::vector<std::uint32_t> slots;
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;  // (master, its temporary)
  std::vector<at::Tensor> temps;
  for (std::size_t i = 0; i < model_grads.size(); ++i) {
    const at::Tensor& model = model_grads[i];
    const at::Tensor& master = master_grads[i];
    if (model.numel() == 0) continue;
    slots.push_back(std::uint32_t(i));
    at::Tensor dst = master;
    if (!master.is_non_overlapping_and_dense()) {
      dst = at::empty(master.sizes(), master.options());
      write_back.emplace_back(master, dst);
    }
    // The source must lie in memory in the destination's order, element for element.
    at::Tensor src = model;
    if (!model.is_non_overlapping_and_dense() || model.strides() != dst.strides()) {
      src = at::empty_strided(dst.sizes(), dst.strides(), model.options());
      src.copy_(model);
      temps.push_back(src);
    }
    spans.push_back({src.data_ptr(), dst.data_ptr<float>(), dst.numel(), dtype_of(model)});
  }
  float* absmax = grad_absmax ? grad_absmax->data_ptr<float>() : nullptr;  // of the sources
  check_status(op, gpu::move_grads_and_unscale(spans.data(), spans.size(),
                                               inv_scale ? inv_scale->data_ptr<float>() : nullptr,
                                               inv, found_inf.data_ptr<float>(), stream, absmax,
                                               attribution(nonfinite, slots)));
  for (auto& [master, temp] : write_back)
    master.copy_(temp);
}

void cuda_update_scale(const char* op, at::Tensor& scale, at::Tensor& growth_tracker,
                       const at::Tensor& found_inf, const ScaleRule& rule) {
  const c10::cuda::CUDAGuard guard(scale.device());
  check_status(op,
               gpu::update_scale(scale.data_ptr<float>(), growth_tracker.data_ptr<std::int32_t>(),
                                 found_inf.data_ptr<float>(), rule, current_stream(scale)));
}

}  // namespace ampactor::kernels::internal
