// C++ interface to the CUDA kernels: raw device pointers, element counts and a stream passed as
// void* (a cudaStream_t; null is the legacy default stream). No CUDA and no torch headers, so any
// .cpp can include it; the kernels themselves are in list_kernels.cu and update_scale.cu.
//
// Every launcher checks all of its input before the first launch and returns 0 on success or a
// cudaError_t value (error_string() names it). Nothing waits for the device: the work is queued
// on `stream` and the caller synchronises when it needs a result on the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include <ampactor/core/update_rule.h>

namespace ampactor::kernels::gpu {

/// Element types of gradients (the same order as the CPU loops' ElemType).
enum class DType : std::uint8_t { f32, f64, f16, bf16 };

/// A run of `numel` consecutive elements of `dtype` in device memory: a dense tensor in memory
/// order (contiguous, transposed or permuted), or one unit-stride row of a sliced tensor.
struct Span {
  void* data;
  std::int64_t numel;
  DType dtype;
};

/// dst[i] = float(src[i]) * inv_scale for i < numel; both runs dense and in the same order.
struct MoveSpan {
  const void* src;
  float* dst;
  std::int64_t numel;
  DType src_dtype;
};

/// Overflow attribution (optional in every launcher): `flags_dev` holds one byte per slot, and
/// span i's slot is `slot_of[i]` (a host array, one per span, in [0, slots)); the launch ORs 1
/// (an inf) and 2 (a NaN) into the slot of each span that held one. Only the blocks that found
/// one read their chunk again to tell which. Slots of consecutive spans must not decrease.
struct Attribution {
  unsigned char* flags_dev = nullptr;
  const std::uint32_t* slot_of = nullptr;
};

/// Status codes outside cudaError_t's range, for input refused before any launch.
constexpr int kInvalidInput = 100000;

/// Multiplies every element of every span by the inverse scale in place and sets *found_inf to
/// 1.0f if any element is inf or NaN (never clears it). The inverse scale is read on the device
/// from `inv_scale_dev` (1 float) or, when that is null, taken from `inv_scale_value`. When it is
/// exactly 1 the spans are only read. Any number of spans; they may mix dtypes.
/// `absmax_dev` (1 float, may be null): raised to the largest finite |element| of the spans as
/// they were read, before the multiply, in the same pass (never lowered: pre-zero it). fp64
/// values are rounded toward zero to float, so a finite one never reports inf.
int unscale_and_check(const Span* spans, std::size_t count, const float* inv_scale_dev,
                      float inv_scale_value, float* found_inf_dev, void* stream,
                      float* absmax_dev = nullptr, Attribution attribution = {});

/// Sets *found_inf to 1.0f if any element is inf or NaN. Reads each span once, writes nothing.
int check_finite(const Span* spans, std::size_t count, float* found_inf_dev, void* stream,
                 float* absmax_dev = nullptr, Attribution attribution = {});

/// The fused grad move: dst = float(src) * inverse scale, checking src for inf/NaN; `absmax_dev`
/// as above, of the sources.
int move_grads_and_unscale(const MoveSpan* spans, std::size_t count, const float* inv_scale_dev,
                           float inv_scale_value, float* found_inf_dev, void* stream,
                           float* absmax_dev = nullptr, Attribution attribution = {});

/// The dynamic scale update (apply_scale_rule, update_rule.h) as a one-thread kernel on device
/// values: *found_inf != 0 is a found inf/NaN. The rule's parameters travel by value.
int update_scale(float* scale_dev, std::int32_t* growth_tracker_dev, const float* found_inf_dev,
                 ScaleRule rule, void* stream);

/// Most spans one launch of the list kernels takes; longer lists take several launches.
std::size_t max_spans_per_launch();

/// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

/// Readable text for a status returned above.
const char* error_string(int status);

}  // namespace ampactor::kernels::gpu
