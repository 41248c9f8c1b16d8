// The unscale/check/move entry points, for every device: every tensor is checked first (so bad
// input changes nothing), each is described as rows of strided elements, then the work goes to
// the CPU body (cpu/unscale_cpu.cpp) or to the CUDA kernels (cuda/dispatch.h).
#include <ampactor/core/errors.h>
#include <ampactor/kernels/unscale.h>

#include <string>
#include <vector>

#include "cpu/unscale_cpu.h"
#include "cuda/dispatch.h"

namespace ampactor::kernels {
namespace {

using cpu::ElemType;
using cpu::kMaxDims;
using cpu::Layout;
using cpu::make_layout;
using cpu::non_overlapping;
using cpu::Op;
using cpu::run_cpu;
using cpu::TensorWork;

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw ScalerError(errc::invalid_gradients, std::string("ampactor::") + op + ": " + what);
}

/// "grads[3]", formatted only when an error needs it (validation runs on every call).
struct Name {
  const char* list;
  std::size_t index;
  std::string str() const { return std::string(list) + "[" + std::to_string(index) + "]"; }
};
std::string operator+(const Name& n, const char* s) {
  return n.str() + s;
}

ElemType elem_type(const char* op, const Name& name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ElemType::f32;
    case at::kDouble:
      return ElemType::f64;
    case at::kHalf:
      return ElemType::f16;
    case at::kBFloat16:
      return ElemType::bf16;
    default:
      fail(op, name + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                   "; expected Float, Double, Half or BFloat16");
  }
}

void check_scalar_tensor(const char* op, const char* name, const at::Tensor& t,
                         const c10::Device& device) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (t.numel() != 1)
    fail(op, std::string(name) + " must have exactly 1 element, got " + std::to_string(t.numel()));
  if (t.scalar_type() != at::kFloat)
    fail(op, std::string(name) + " must be a Float tensor, got " +
                 std::string(c10::toString(t.scalar_type())));
  if (t.device() != device)
    fail(op, std::string(name) + " is on " + t.device().str() + " but the gradients are on " +
                 device.str());
}

/// Whether the kernel writes a tensor it checks (a read-only one may be any strided layout).
enum class Use { read, written };

void check_grad(const char* op, const Name& name, const at::Tensor& t, const c10::Device& device,
                Use use) {
  const bool written = use == Use::written;
  if (!t.defined()) fail(op, name + " is undefined");
  if (t.layout() != at::kStrided) fail(op, name + " is not a strided (dense) tensor");
  if (t.device() != device)
    fail(op, name + " is on " + t.device().str() + " but the others are on " + device.str() +
                 " (all tensors must be on one device)");
  if (t.dim() > kMaxDims) fail(op, name + " has more than 16 dimensions");
  if (written && !non_overlapping(t))
    fail(op, name + " has overlapping memory (e.g. an expanded tensor) and cannot be written");
}

void check_device_supported(const char* op, const c10::Device& device) {
  if (device.is_cpu()) return;
  if (device.is_cuda()) {
    if (const char* why = internal::cuda_unavailable_reason())
      fail(op, "tensors on " + device.str() + " need the CUDA kernels, but " + why);
    return;
  }
  fail(op, "tensors on " + device.str() +
               " have no kernels (CPU tensors run the CPU loops; CUDA tensors need the CUDA "
               "kernels)");
}

void set_found(at::Tensor& found_inf) {
  found_inf.data_ptr<float>()[0] = 1.0f;
}

void bump_versions(at::TensorList ts) {
  // The writes bypass the dispatcher; keep autograd's in-place bookkeeping honest.
  for (const at::Tensor& t : ts)
    if (t.numel() > 0 && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

float read_inv_scale(const char* op, const at::Tensor& inv_scale, const c10::Device& device) {
  check_scalar_tensor(op, "inv_scale", inv_scale, device);
  return inv_scale.data_ptr<float>()[0];
}

c10::Device common_device(at::TensorList grads, const at::Tensor& found_inf) {
  return found_inf.defined()
             ? found_inf.device()
             : (grads.empty() || !grads[0].defined() ? c10::Device(c10::kCPU) : grads[0].device());
}

void check_absmax(const char* op, at::Tensor* absmax, const at::Tensor& found_inf) {
  if (!absmax) return;
  check_scalar_tensor(op, "grad_absmax", *absmax, found_inf.device());
  if (absmax->is_same(found_inf)) fail(op, "grad_absmax and found_inf must be two tensors");
}

/// The attribution's flags: one Byte per gradient, contiguous, on the device, a tensor of its own.
void check_nonfinite(const char* op, at::Tensor* flags, std::size_t count,
                     const at::Tensor& found_inf, const at::Tensor* absmax) {
  if (!flags) return;
  if (!flags->defined()) fail(op, "nonfinite is undefined");
  if (flags->scalar_type() != at::kByte)
    fail(op, "nonfinite must be a Byte (uint8) tensor, got " +
                 std::string(c10::toString(flags->scalar_type())));
  if (flags->device() != found_inf.device())
    fail(op, "nonfinite is on " + flags->device().str() + " but the gradients are on " +
                 found_inf.device().str());
  if (flags->numel() != std::int64_t(count))
    fail(op, "nonfinite has " + std::to_string(flags->numel()) + " elements for " +
                 std::to_string(count) + " gradients (one byte per gradient)");
  if (!flags->is_contiguous()) fail(op, "nonfinite must be contiguous");
  if (flags->is_same(found_inf) || (absmax && flags->is_same(*absmax)))
    fail(op, "nonfinite must be a tensor of its own");
}

/// What both entries check before any gradient: found_inf, grad_absmax, the device (before any
/// data pointer is read on the host) and inv_scale. Returns the inverse scale: read here from a
/// host tensor; a device tensor is the kernel's to read, and `inv` comes back as it was.
float check_scales(const char* op, const c10::Device& device, const at::Tensor& found_inf,
                   at::Tensor* absmax, const at::Tensor* inv_tensor, float inv) {
  check_scalar_tensor(op, "found_inf", found_inf, device);
  check_absmax(op, absmax, found_inf);
  check_device_supported(op, device);
  if (!inv_tensor) return inv;
  if (device.is_cuda()) {
    check_scalar_tensor(op, "inv_scale", *inv_tensor, device);
    return inv;
  }
  return read_inv_scale(op, *inv_tensor, device);
}

void unscale_impl(const char* op, at::TensorList grads, const at::Tensor* inv_tensor, float inv,
                  at::Tensor& found_inf, at::Tensor* absmax, at::Tensor* flags = nullptr) {
  const c10::Device device = common_device(grads, found_inf);
  const bool on_cuda = device.is_cuda();
  inv = check_scales(op, device, found_inf, absmax, inv_tensor, inv);
  check_nonfinite(op, flags, grads.size(), found_inf, absmax);
  // Check-only when the multiply is the identity: one read, no write. A device inv_scale is read
  // by the kernel, not here, so the gradients must then be writable.
  const bool write = (on_cuda && inv_tensor) || inv != 1.0f;
  std::vector<TensorWork> jobs;
  jobs.reserve(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Name name{"grads", i};
    check_grad(op, name, grads[i], device, write ? Use::written : Use::read);
    jobs.push_back({make_layout(grads[i], nullptr),
                    {static_cast<char*>(grads[i].data_ptr()), elem_type(op, name, grads[i])},
                    {nullptr, ElemType::f32}});
  }
  if (on_cuda)
    internal::cuda_unscale(op, grads, inv_tensor, inv, found_inf, !write, absmax, flags);
  else if (run_cpu(write ? Op::unscale : Op::check, jobs, inv, absmax,
                   flags ? flags->data_ptr<std::uint8_t>() : nullptr))
    set_found(found_inf);
  if (write) bump_versions(grads);
}

void move_impl(at::TensorList model_grads, at::TensorList master_grads,
               const at::Tensor* inv_tensor, float inv, at::Tensor& found_inf, at::Tensor* absmax,
               at::Tensor* flags = nullptr) {
  const char* op = "move_grads_and_unscale";
  const c10::Device device = common_device(model_grads, found_inf);
  const bool on_cuda = device.is_cuda();
  inv = check_scales(op, device, found_inf, absmax, inv_tensor, inv);
  check_nonfinite(op, flags, model_grads.size(), found_inf, absmax);
  if (model_grads.size() != master_grads.size())
    fail(op, "got " + std::to_string(model_grads.size()) + " model grads but " +
                 std::to_string(master_grads.size()) + " master grads");
  std::vector<TensorWork> jobs;
  jobs.reserve(model_grads.size());
  for (std::size_t i = 0; i < model_grads.size(); ++i) {
    const Name model_name{"model_grads", i};
    const Name master_name{"master_grads", i};
    const at::Tensor& model = model_grads[i];
    const at::Tensor& master = master_grads[i];
    check_grad(op, model_name, model, device, Use::read);
    check_grad(op, master_name, master, device, Use::written);
    const ElemType type = elem_type(op, model_name, model);
    if (master.scalar_type() != at::kFloat)
      fail(op, master_name + " has dtype " + std::string(c10::toString(master.scalar_type())) +
                   "; master grads must be Float");
    if (model.sizes() != master.sizes())
      fail(op, master_name + " has shape " + c10::str(master.sizes()) + " but " + model_name.str() +
                   " has shape " + c10::str(model.sizes()));
    // Walk in the masters' memory order: they are the tensors written.
    jobs.push_back({make_layout(master, &model), {nullptr, type}, {nullptr, ElemType::f32}});
    // make_layout put the master first; swap the stride sets so operand a (the model) is slot 0.
    Layout& l = jobs.back().layout;
    std::swap(l.strides[0], l.strides[1]);
    std::swap(l.col_stride[0], l.col_stride[1]);
    jobs.back().a.base = static_cast<char*>(const_cast<void*>(model.data_ptr()));
    jobs.back().b.base = static_cast<char*>(master.data_ptr());
  }
  if (on_cuda)
    internal::cuda_move(op, model_grads, master_grads, inv_tensor, inv, found_inf, absmax, flags);
  else if (run_cpu(Op::move, jobs, inv, absmax, flags ? flags->data_ptr<std::uint8_t>() : nullptr))
    set_found(found_inf);
  bump_versions(master_grads);
}

}  // namespace

void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf) {
  unscale_impl("unscale_and_check", grads, &inv_scale, 0.0f, found_inf, nullptr);
}

void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf) {
  unscale_impl("unscale_and_check", grads, nullptr, inv_scale, found_inf, nullptr);
}

void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf,
                       at::Tensor& grad_absmax) {
  unscale_impl("unscale_and_check", grads, &inv_scale, 0.0f, found_inf, &grad_absmax);
}

void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf,
                       at::Tensor& grad_absmax) {
  unscale_impl("unscale_and_check", grads, nullptr, inv_scale, found_inf, &grad_absmax);
}

void check_finite(at::TensorList grads, at::Tensor& found_inf) {
  unscale_impl("check_finite", grads, nullptr, 1.0f, found_inf, nullptr);
}

void check_finite(at::TensorList grads, at::Tensor& found_inf, at::Tensor& grad_absmax) {
  unscale_impl("check_finite", grads, nullptr, 1.0f, found_inf, &grad_absmax);
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf) {
  move_impl(model_grads, master_grads, nullptr, inv_scale, found_inf, nullptr);
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf) {
  move_impl(model_grads, master_grads, &inv_scale, 0.0f, found_inf, nullptr);
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf, at::Tensor& grad_absmax) {
  move_impl(model_grads, master_grads, nullptr, inv_scale, found_inf, &grad_absmax);
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf,
                            at::Tensor& grad_absmax) {
  move_impl(model_grads, master_grads, &inv_scale, 0.0f, found_inf, &grad_absmax);
}

namespace {
/// The Measures' tensors as the impls take them (handles: they write the caller's tensors).
struct Outs {
  at::Tensor absmax, flags;
  explicit Outs(const Measures& m) : absmax(m.grad_absmax()), flags(m.nonfinite()) {}
  at::Tensor* a() { return absmax.defined() ? &absmax : nullptr; }
  at::Tensor* f() { return flags.defined() ? &flags : nullptr; }
};
}  // namespace

void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf,
                       const Measures& m) {
  Outs o(m);
  unscale_impl("unscale_and_check", grads, nullptr, inv_scale, found_inf, o.a(), o.f());
}

void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf,
                       const Measures& m) {
  Outs o(m);
  unscale_impl("unscale_and_check", grads, &inv_scale, 0.0f, found_inf, o.a(), o.f());
}

void check_finite(at::TensorList grads, at::Tensor& found_inf, const Measures& m) {
  Outs o(m);
  unscale_impl("check_finite", grads, nullptr, 1.0f, found_inf, o.a(), o.f());
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf, const Measures& m) {
  Outs o(m);
  move_impl(model_grads, master_grads, nullptr, inv_scale, found_inf, o.a(), o.f());
}

void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf, const Measures& m) {
  Outs o(m);
  move_impl(model_grads, master_grads, &inv_scale, 0.0f, found_inf, o.a(), o.f());
}

const char* cpu_loop_variant() {
  return cpu::loops().name;
}

}  // namespace ampactor::kernels
