// The fused optimizer steps' raw loops: one pass per tensor reads the model's gradient in its own
// dtype, unscales it, updates the fp32 master and the optimizer's state, and writes the model's
// weight in its dtype. Torch-free (raw pointers and counts); ampactor/optim builds the spans
// from tensors. Every constant is a float already rounded as LibTorch rounds its Scalars, so that
// the loops reproduce torch::optim's arithmetic element by element.
#pragma once

#include <cstdint>
#include <vector>

namespace ampactor::kernels {

/// Element types a span may hold for the gradient and the model weight.
enum class StepElem : std::uint8_t { f32, f16, bf16 };

/// One contiguous parameter: n elements of each array (the state arrays are fp32).
struct StepSpan {
  const void* grad = nullptr;  // the model's gradient (grad_type)
  StepElem grad_type = StepElem::f32;
  float* param = nullptr;  // the fp32 master, updated in place
  float* m = nullptr;      // Adam: exp_avg; SGD: the momentum buffer (null: no momentum)
  float* v = nullptr;      // Adam: exp_avg_sq
  float* vmax = nullptr;   // Adam with amsgrad: max_exp_avg_sq (else null)
  void* weight = nullptr;  // the model's weight to write (weight_type), or null
  StepElem weight_type = StepElem::f32;
  std::int64_t n = 0;
  int consts = 0;  // index into the step's constants (one set per parameter group and step count)
  // Out of place: where the new master and state go (each null: in place, over its input). The
  // inputs are then only read, so a step written here can be kept or dropped (a speculative
  // step). An output may not overlap any other array of the span but its own input.
  float* param_out = nullptr;
  float* m_out = nullptr;
  float* v_out = nullptr;
  float* vmax_out = nullptr;
};

/// Adam and AdamW. g = grad * inv; Adam: g = fma(p, wd, g); AdamW: p = p * decay; then
/// m = fma(g, 1 - b1, m * b1), v = fma((1 - b2) * g, g, v * b2), vmax = max(vmax, v),
/// p = p + (neg_step * m) / (sqrt(v or vmax) / sqrt_bc2 + eps), the weight = p in its dtype.
struct AdamConsts {
  float inv = 1, wd = 0, decay = 1, b1 = 0, omb1 = 0, b2 = 0, omb2 = 0, sqrt_bc2 = 1, eps = 0,
        neg_step = 0;
  bool l2 = false;         // Adam's weight decay (added to the gradient)
  bool decoupled = false;  // AdamW's (p multiplied by decay)
  // Divide by sqrt_bc2 through its reciprocal in the vector loops (as exact; fewer divides,
  // more instructions). adam_step sets it where the step's arrays fit the last-level cache, so
  // that the divide unit bounds the loop; beyond the cache memory does, and the divide is ahead.
  bool reciprocal = false;
  // Write the model's weights with non-temporal stores: beyond the last-level cache a weight
  // line need not be read before it is overwritten (2 of the step's 32 bytes per parameter),
  // and the next user reads it from memory either way. adam_step and sgd_step set it there.
  bool stream_weight = false;
};

/// SGD. d = grad * inv; d = fma(p, wd, d) if l2; with momentum: m = d on the first step, else
/// m = fma(d, 1 - dampening, m * momentum); d = nesterov ? fma(m, momentum, d) : m;
/// p = fma(d, neg_lr, p), the weight = p in its dtype.
struct SgdConsts {
  float inv = 1, wd = 0, momentum = 0, omdamp = 1, neg_lr = 0;
  bool l2 = false, first = false, nesterov = false;
  bool stream_weight = false;  // as AdamConsts'
};

/// Runs every span, parallel over `threads` threads (1: on the caller alone): on the main
/// thread, its OpenMP team (LibTorch's, whose workers a trainer keeps awake); on any other
/// thread, a pool of worker threads of the kernels' own, never a second OpenMP team. Each thread
/// takes an equal, cache-line aligned share of all the spans' elements together.
void adam_step(const std::vector<StepSpan>& spans, const std::vector<AdamConsts>& consts,
               int threads);
void sgd_step(const std::vector<StepSpan>& spans, const std::vector<SgdConsts>& consts,
              int threads);

/// Whether steps whose arrays exceed the last-level cache write the model's weights with
/// non-temporal stores (on unless AMPACTOR_STREAM_WEIGHTS=0 is in the environment). The bits are
/// the same either way; the switch is for measuring what streaming gains.
void set_stream_weights(bool on);
bool stream_weights();

/// The instruction-set variant the fused steps run: "avx512" where the CPU has AVX-512 F, BW, VL
/// and DQ, else "avx2" where it has AVX2, F16C and FMA (both fuse the multiply-adds LibTorch's AVX2
/// and AVX-512 kernels fuse, and give the same bits), else "baseline" (no FMA, as LibTorch's
/// default kernels). ATEN_CPU_CAPABILITY=default in the environment picks the baseline too, so
/// that the steps stay equal to torch::optim's wherever LibTorch is made to run its default
/// kernels; ATEN_CPU_CAPABILITY=avx2 caps them at "avx2".
const char* fused_step_variant();

}  // namespace ampactor::kernels
