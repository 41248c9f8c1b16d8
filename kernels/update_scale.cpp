// The update_scale entry point, for every device: checks, then the rule on the host for CPU
// tensors (cpu/update_scale_cpu.cpp) or the one-thread kernel for CUDA tensors (cuda/dispatch.h);
// both apply apply_scale_rule from the core.
#include <ampactor/core/errors.h>
#include <ampactor/kernels/update_scale.h>

#include <string>

#include "cpu/update_scale_cpu.h"
#include "cuda/dispatch.h"

namespace ampactor::kernels {
namespace {

constexpr const char* kOp = "update_scale";

[[noreturn]] void fail(errc code, const std::string& what) {
  throw ScalerError(code, std::string("ampactor::") + kOp + ": " + what);
}

[[noreturn]] void refuse_tensor(const std::string& what) {
  fail(errc::invalid_gradients, what);
}

void check_one(const char* name, const at::Tensor& t, at::ScalarType dtype,
               const c10::Device& device) {
  if (!t.defined()) refuse_tensor(std::string(name) + " is undefined");
  if (t.numel() != 1)
    refuse_tensor(std::string(name) + " must have exactly 1 element, got " +
                  std::to_string(t.numel()));
  if (t.scalar_type() != dtype)
    refuse_tensor(std::string(name) + " must be a " + c10::toString(dtype) + " tensor, got " +
                  c10::toString(t.scalar_type()));
  if (t.device() != device)
    refuse_tensor(std::string(name) + " is on " + t.device().str() + " but scale is on " +
                  device.str());
}

}  // namespace

void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                  double growth_factor, double backoff_factor, std::int64_t growth_interval) {
  if (!scale.defined()) refuse_tensor("scale is undefined");
  const c10::Device device = scale.device();
  check_one("scale", scale, at::kFloat, device);
  check_one("growth_tracker", growth_tracker, at::kInt, device);
  check_one("found_inf", found_inf, at::kFloat, device);
  if (growth_interval < 1)
    fail(errc::bad_growth_interval,
         "growth_interval must be at least 1, got " + std::to_string(growth_interval));
  const ScaleRule rule{growth_factor, backoff_factor, growth_interval};
  if (device.is_cuda()) {
    if (const char* why = internal::cuda_unavailable_reason())
      refuse_tensor("tensors on " + device.str() + " need the CUDA kernels, but " + why);
    internal::cuda_update_scale(kOp, scale, growth_tracker, found_inf, rule);
  } else if (device.is_cpu()) {
    cpu::update_scale(scale.data_ptr<float>()[0], growth_tracker.data_ptr<std::int32_t>()[0],
                      found_inf.data_ptr<float>()[0] != 0.0f, rule);
  } else {
    refuse_tensor("tensors on " + device.str() + " have no kernels (CPU or CUDA only)");
  }
  // Written behind the dispatcher's back: keep autograd's in-place bookkeeping honest.
  for (at::Tensor* t : {&scale, &growth_tracker})
    if (!t->is_inference()) t->unsafeGetTensorImpl()->bump_version();
}

}  // namespace ampactor::kernels
