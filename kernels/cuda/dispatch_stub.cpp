// The CUDA branch where it cannot run: without the CUDA kernels, or against a LibTorch without
// CUDA (no CUDA tensor can exist there, but the message says why if one ever arrives).
#include <ampactor/core/errors.h>

#include <string>

#include "dispatch.h"

namespace ampactor::kernels::internal {

const char* cuda_unavailable_reason() {
#ifdef AMPACTOR_CUDA_BUILT
  return "the LibTorch this was built against has no CUDA support";
#else
  return "ampactor was built without CUDA (AMPACTOR_CUDA=OFF)";
#endif
}

namespace {
[[noreturn]] void unavailable(const char* op) {
  throw ScalerError(errc::invalid_gradients, std::string("ampactor::") + op +
                                                 ": CUDA tensors need the CUDA kernels, but " +
                                                 cuda_unavailable_reason());
}
}  // namespace

void cuda_unscale(const char* op, at::TensorList, const at::Tensor*, float, at::Tensor&, bool,
                  at::Tensor*, at::Tensor*) {
  unavailable(op);
}

void cuda_move(const char* op, at::TensorList, at::TensorList, const at::Tensor*, float,
               at::Tensor&, at::Tensor*, at::Tensor*) {
  unavailable(op);
}

void cuda_update_scale(const char* op, at::Tensor&, at::Tensor&, const at::Tensor&,
                       const ScaleRule&) {
  unavailable(op);
}

}  // namespace ampactor::kernels::internal
