// Fused gradient kernels: unscale + non-finite check, check-only, and the grad move into fp32
// master gradients. One entry point per operation; tensors on the CPU run the vectorised,
// thread-parallel loops of kernels/cpu.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace ampactor::kernels {

/// Multiplies every gradient in place by `inv_scale` and sets `found_inf` to 1.0 if any element
/// of any gradient is inf or NaN (inf and NaN stay in the gradients).
///
/// Gradients may be fp32, fp64, fp16 or bf16 (math in float for the 16-bit types), contiguous or
/// not; all on one device. `inv_scale` and `found_inf` are 1-element fp32 tensors on that device.
/// Pre-zeroing `found_inf` is the caller's job: it is only ever set, never cleared. When
/// `inv_scale` is exactly 1 the gradients are only read. An empty list is fine and finds nothing.
/// Bad input (dtype, device, shape, overlapping memory; the same on CPU and CUDA) throws
/// ampactor::ScalerError with errc::invalid_gradients before any gradient is touched. A failure
/// of the CUDA runtime itself (a launch error) throws std::runtime_error.
void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf);

/// The same with the inverse scale as a host value.
void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf);

/// Sets `found_inf` to 1.0 if any element is inf or NaN. Reads each gradient once, writes nothing.
void check_finite(at::TensorList grads, at::Tensor& found_inf);

/// master_grads[i] = float(model_grads[i]) * inv_scale, checking model_grads for inf/NaN, in one
/// pass. Model grads may be fp16, bf16, fp32 or fp64; masters are fp32 of the same shapes.
/// Errors as for unscale_and_check; nothing is written when the input is refused.
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf);

/// The same with the inverse scale as a 1-element fp32 tensor.
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf);

/// The gradient-size forms: each also raises `grad_absmax` (a 1-element fp32 tensor on the
/// gradients' device, not `found_inf`) to the largest finite |gradient| of the call, as the
/// gradients were handed in (before the multiply by the inverse scale; for the move, of the model
/// grads), in the same pass. inf and NaN elements are left out of it. Like found_inf it is only
/// ever raised, never lowered: pre-zero it. An fp64 gradient's magnitude is rounded toward zero
/// to float, so a finite one never reports inf. Together with the dtype's largest finite value
/// it says how much larger a scale the same gradients would have taken without overflowing.
void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf,
                       at::Tensor& grad_absmax);
void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf,
                       at::Tensor& grad_absmax);
void check_finite(at::TensorList grads, at::Tensor& found_inf, at::Tensor& grad_absmax);
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf, at::Tensor& grad_absmax);
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf,
                            at::Tensor& grad_absmax);

/// Overflow attribution: which gradients of a call held inf or NaN. One byte per gradient of the
/// call (Byte (uint8) tensor of that many elements, contiguous, on the gradients' device, not
/// found_inf nor grad_absmax): bit kHeldInf is set where the gradient held an inf, bit kHeldNaN
/// where it held a NaN; only ever set, never cleared (pre-zero it). The flags come from the same
/// pass as found_inf; only the gradients (on the GPU, the 8192-element blocks) that held one are
/// read again to tell inf from NaN, so a clean call costs what it cost without them. An unscale
/// whose inverse scale is above 1 (a scale below 1) reads that second time after the multiply,
/// which can turn a large finite value into an inf: such a gradient may then show kHeldInf too.
constexpr std::uint8_t kHeldInf = 1;
constexpr std::uint8_t kHeldNaN = 2;

/// What a call measures besides found_inf, each optional (named setters).
class Measures {
 public:
  /// As the grad_absmax argument of the overloads above.
  Measures& grad_absmax(at::Tensor t) {
    grad_absmax_ = std::move(t);
    return *this;
  }
  /// Overflow attribution (above).
  Measures& nonfinite(at::Tensor t) {
    nonfinite_ = std::move(t);
    return *this;
  }
  const at::Tensor& grad_absmax() const { return grad_absmax_; }
  const at::Tensor& nonfinite() const { return nonfinite_; }

 private:
  at::Tensor grad_absmax_, nonfinite_;
};

/// The measured forms: as above, also filling what `m` names. Errors as above; a `nonfinite`
/// of the wrong dtype, size, layout or device is refused before any gradient is touched.
void unscale_and_check(at::TensorList grads, float inv_scale, at::Tensor& found_inf,
                       const Measures& m);
void unscale_and_check(at::TensorList grads, const at::Tensor& inv_scale, at::Tensor& found_inf,
                       const Measures& m);
void check_finite(at::TensorList grads, at::Tensor& found_inf, const Measures& m);
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            float inv_scale, at::Tensor& found_inf, const Measures& m);
void move_grads_and_unscale(at::TensorList model_grads, at::TensorList master_grads,
                            const at::Tensor& inv_scale, at::Tensor& found_inf, const Measures& m);

/// Name of the CPU loop variant picked for this machine ("avx512", "avx2" or "baseline";
/// ATEN_CPU_CAPABILITY=avx2 or default caps it, as it caps LibTorch's kernels).
const char* cpu_loop_variant();

}  // namespace ampactor::kernels
