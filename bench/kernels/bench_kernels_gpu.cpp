// GPU figures: the fused unscale + check, check-only and the fp16 -> fp32 grad move on device
// memory, timed with CUDA events on one stream, beside a device-to-device copy of the same bytes
// and (with a CUDA LibTorch) at::_amp_foreach_non_finite_check_and_unscale_ on the same tensors;
// and the unscale with the overflow attribution (a flag per tensor, zeroed in each call) against
// the same without it, timed before and after it (goal: <= 2% slower).
#include "bench_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#ifdef AMPACTOR_CUDA_BUILT
#include <cuda_runtime_api.h>

#include "launch.h"
#endif
#ifdef AMPACTOR_TORCH_CUDA
#include <ATen/ATen.h>
#endif

namespace ampactor::bench {

#ifndef AMPACTOR_CUDA_BUILT

void run_gpu_figures(const GpuBenchOptions&, nlohmann::json& out) {
  std::cout << "\nbuilt without CUDA (AMPACTOR_CUDA=OFF); GPU figures skipped\n";
  out["gpu/skipped"] = "built without CUDA";
}

#else

namespace {

namespace gpu = ampactor::kernels::gpu;

[[noreturn]] void die(const char* what, int status) {
  std::cerr << "CUDA error in " << what << ": " << gpu::error_string(status) << "\n";
  std::exit(1);
}
void ok(const char* what, int status) {
  if (status != 0) die(what, status);
}

/// A list of tensors packed into one device buffer, each start 256-byte aligned (as torch's
/// allocator gives), with element counts log-uniform over a 1000x range.
struct DeviceList {
  void* base = nullptr;
  std::size_t bytes = 0;
  std::vector<gpu::Span> spans;
  DeviceList(const std::vector<std::int64_t>& numels, gpu::DType type, std::size_t elem_size) {
    std::vector<std::size_t> offsets;
    for (std::int64_t n : numels) {
      offsets.push_back(bytes);
      bytes += (std::size_t(n) * elem_size + 255) / 256 * 256;
    }
    ok("cudaMalloc", cudaMalloc(&base, bytes));
    for (std::size_t i = 0; i < numels.size(); ++i)
      spans.push_back({static_cast<char*>(base) + offsets[i], numels[i], type});
  }
  ~DeviceList() { cudaFree(base); }
};

std::vector<std::int64_t> log_uniform_numels(std::int64_t total_elems, int count,
                                             std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, std::log(1000.0));
  std::vector<double> w(static_cast<std::size_t>(count));
  double sum = 0;
  for (double& x : w)
    sum += (x = std::exp(u(rng)));
  std::vector<std::int64_t> out;
  for (double x : w)
    out.push_back(std::max<std::int64_t>(1, std::int64_t(double(total_elems) * x / sum)) | 1);
  return out;
}

/// Fills fp32 (or fp16 when `half`) spans with finite values of moderate size.
void fill(const DeviceList& list, bool half) {
  std::vector<char> host(list.bytes);
  std::uint32_t state = 12345;
  if (half) {
    auto* p = reinterpret_cast<std::uint16_t*>(host.data());
    for (std::size_t i = 0; i < list.bytes / 2; ++i) {
      state = state * 1664525u + 1013904223u;
      p[i] = std::uint16_t(0x3c00u | ((state >> 16) & 0x03ffu) | ((state >> 8) & 0x8000u));
    }
  } else {
    auto* p = reinterpret_cast<float*>(host.data());
    for (std::size_t i = 0; i < list.bytes / 4; ++i) {
      state = state * 1664525u + 1013904223u;
      p[i] = float(std::int32_t(state >> 8) - (1 << 23)) / float(1 << 19);
    }
  }
  ok("upload", cudaMemcpy(list.base, host.data(), list.bytes, cudaMemcpyHostToDevice));
}

/// Median time of one call of `fn`, in seconds, over `reps` event-timed batches of `inner` calls.
template <typename F>
double median_seconds(F&& fn, int reps, int inner = 1) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  ok("warm-up", int(cudaDeviceSynchronize()));
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(start, nullptr);
    for (int i = 0; i < inner; ++i)
      fn();
    cudaEventRecord(stop, nullptr);
    ok("timing", int(cudaEventSynchronize(stop)));
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(double(ms) / 1e3 / inner);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void row(const std::string& label, double gbps, const std::string& note = "") {
  std::cout << "  " << std::left << std::setw(44) << label << std::right << std::setw(9)
            << std::fixed << std::setprecision(1) << gbps << " GB/s  " << note << "\n";
}

std::string ratio_text(double r, double goal) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << r << "x (goal >= " << goal
    << "x: " << (r >= goal ? "met" : "NOT met") << ")";
  return s.str();
}

#ifdef AMPACTOR_TORCH_CUDA
std::vector<at::Tensor> as_tensors(const DeviceList& list, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  auto opts = at::TensorOptions().dtype(dtype).device(at::kCUDA);
  for (const gpu::Span& s : list.spans)
    out.push_back(at::from_blob(s.data, {s.numel}, opts));
  return out;
}
#endif

struct Flags {
  float* found = nullptr;
  float* inv = nullptr;  // [0.5, 2.0]: alternating keeps values normal and finite
  Flags() {
    ok("cudaMalloc", cudaMalloc(reinterpret_cast<void**>(&found), 4));
    ok("cudaMalloc", cudaMalloc(reinterpret_cast<void**>(&inv), 8));
    const float h[2] = {0.5f, 2.0f};
    ok("upload", cudaMemcpy(inv, h, 8, cudaMemcpyHostToDevice));
    ok("memset", cudaMemset(found, 0, 4));
  }
  ~Flags() {
    cudaFree(found);
    cudaFree(inv);
  }
};

void run_list(const std::string& tag, const std::vector<std::int64_t>& numels, int reps, int inner,
              nlohmann::json& out) {
  DeviceList grads(numels, gpu::DType::f32, 4), copy_dst(numels, gpu::DType::f32, 4);
  DeviceList half(numels, gpu::DType::f16, 2), master(numels, gpu::DType::f32, 4);
  fill(grads, false);
  fill(half, true);
  std::vector<gpu::MoveSpan> moves;
  for (std::size_t i = 0; i < numels.size(); ++i)
    moves.push_back({half.spans[i].data, static_cast<float*>(master.spans[i].data), numels[i],
                     gpu::DType::f16});
  Flags flags;
  double elems = 0;
  for (std::int64_t n : numels)
    elems += double(n);
  const double gb = elems * 4 / 1e9;
  int flip = 0;

  const double t_copy = median_seconds(
      [&] {
        ok("copy", int(cudaMemcpyAsync(copy_dst.base, grads.base, grads.bytes,
                                       cudaMemcpyDeviceToDevice, nullptr)));
      },
      reps, inner);
  const auto unscale = [&] {
    ok("unscale", gpu::unscale_and_check(grads.spans.data(), grads.spans.size(),
                                         flags.inv + (flip++ & 1), 0.0f, flags.found, nullptr));
  };
  const double t_ours = median_seconds(unscale, reps, inner);
  // The attribution: one flag byte per tensor, zeroed in each call as a scaler would.
  unsigned char* attr_flags = nullptr;
  ok("cudaMalloc", int(cudaMalloc(reinterpret_cast<void**>(&attr_flags), numels.size())));
  std::vector<std::uint32_t> slots(numels.size());
  for (std::size_t i = 0; i < slots.size(); ++i)
    slots[i] = std::uint32_t(i);
  const double t_attr = median_seconds(
      [&] {
        ok("memset", int(cudaMemsetAsync(attr_flags, 0, numels.size(), nullptr)));
        ok("unscale+attribution",
           gpu::unscale_and_check(grads.spans.data(), grads.spans.size(), flags.inv + (flip++ & 1),
                                  0.0f, flags.found, nullptr, nullptr, {attr_flags, slots.data()}));
      },
      reps, inner);
  const double t_ours_again = median_seconds(unscale, reps, inner);
  cudaFree(attr_flags);
  const double t_plain = (t_ours + t_ours_again) / 2;  // before and after: the drift between
  const double t_check = median_seconds(
      [&] {
        ok("check",
           gpu::check_finite(grads.spans.data(), grads.spans.size(), flags.found, nullptr));
      },
      reps, inner);
  const double t_move = median_seconds(
      [&] {
        ok("move", gpu::move_grads_and_unscale(moves.data(), moves.size(), flags.inv, 0.0f,
                                               flags.found, nullptr));
      },
      reps, inner);
  const std::size_t launches =
      (numels.size() + gpu::max_spans_per_launch() - 1) / gpu::max_spans_per_launch();

  row("device-to-device copy (reference)", gb / t_copy,
      "(bytes of the list per second; the copy reads and writes them, like the unscale)");
  row("ours: fused unscale + check", gb / t_ours,
      ratio_text(t_copy / t_ours, 0.9) + " of copy, " + std::to_string(launches) + " launch(es)");
  row("ours: unscale + check + attribution", gb / t_attr,
      ratio_text(t_plain / t_attr, 0.98) + " of without (" +
          std::to_string(int(t_ours * 1e6 + 0.5)) + " and " +
          std::to_string(int(t_ours_again * 1e6 + 0.5)) + " us without, before and after)");
  row("ours: check-only", gb / t_check);
  row("ours: grad move fp16 -> fp32", elems * 2 / 1e9 / t_move, "(GB of fp16 read per second)");
  std::cout << "  per call: ours " << std::setprecision(1) << t_ours * 1e6 << " us, copy "
            << t_copy * 1e6 << " us\n";
  out[tag + "/copy_GBps"] = gb / t_copy;
  out[tag + "/ours_unscale_GBps"] = gb / t_ours;
  out[tag + "/ours_check_GBps"] = gb / t_check;
  out[tag + "/ours_move_fp16_GBps"] = elems * 2 / 1e9 / t_move;
  out[tag + "/ratio_ours_vs_copy"] = t_copy / t_ours;
  out[tag + "/ours_unscale_us"] = t_ours * 1e6;
  out[tag + "/launches"] = launches;
  out[tag + "/ours_unscale_attr_GBps"] = gb / t_attr;
  out[tag + "/ours_unscale_again_us"] = t_ours_again * 1e6;
  out[tag + "/ratio_attr_vs_plain"] = t_plain / t_attr;
#ifdef AMPACTOR_TORCH_CUDA
  std::vector<at::Tensor> tensors = as_tensors(grads, at::kFloat);
  auto opts = at::TensorOptions().device(at::kCUDA);
  at::Tensor found = at::zeros({1}, opts);
  at::Tensor invs[2] = {at::full({1}, 0.5f, opts), at::full({1}, 2.0f, opts)};
  const double t_torch = median_seconds(
      [&] { at::_amp_foreach_non_finite_check_and_unscale_(tensors, found, invs[flip++ & 1]); },
      reps, inner);
  row("torch: _amp_foreach_non_finite_check_and_unscale_", gb / t_torch,
      "(" + std::to_string(int(t_torch * 1e6)) + " us per call)");
  std::cout << "  ours vs torch: unscale " << ratio_text(t_torch / t_ours, 1.0) << ", check-only "
            << ratio_text(t_torch / t_check, 1.8) << "\n";
  out[tag + "/torch_unscale_GBps"] = gb / t_torch;
  out[tag + "/torch_unscale_us"] = t_torch * 1e6;
  out[tag + "/ratio_ours_vs_torch"] = t_torch / t_ours;
  out[tag + "/ratio_check_vs_torch"] = t_torch / t_check;
#else
  std::cout << "  torch's kernel: not measured (this LibTorch has no CUDA)\n";
#endif
}

}  // namespace

void run_gpu_figures(const GpuBenchOptions& opts, nlohmann::json& out) {
  if (gpu::device_count() == 0) {
    std::cout << "\nno CUDA device; GPU figures skipped\n";
    out["gpu/skipped"] = "no CUDA device";
    return;
  }
  cudaDeviceProp prop{};
  ok("cudaGetDeviceProperties", int(cudaGetDeviceProperties(&prop, 0)));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::cout << "\nGPU: " << prop.name << " (sm_" << prop.major << prop.minor << ", "
            << prop.multiProcessorCount << " SMs), driver API " << driver / 1000 << "."
            << driver % 1000 / 10 << ", runtime " << runtime / 1000 << "." << runtime % 1000 / 10
            << "\n";
  out["gpu/meta/device"] = prop.name;
  out["gpu/meta/driver_api"] = driver;
  out["gpu/meta/runtime"] = runtime;
  for (std::int64_t mb : opts.sizes_mb) {
    std::cout << "\n[GPU: " << mb << " MB of fp32 grads in " << opts.tensors << " tensors]\n";
    run_list("gpu/" + std::to_string(mb) + "MB",
             log_uniform_numels((mb << 20) / 4, opts.tensors, 1), std::max(opts.min_reps, 10),
             mb <= 16 ? 20 : 1, out);
  }
  // Launch-bound: a thousand small tensors of odd sizes, one launch for ours.
  std::vector<std::int64_t> small;
  for (int i = 0; i < 1000; ++i)
    small.push_back(std::int64_t(i) * 7919 % 4001 + 1);
  std::cout << "\n[GPU: 1000 small fp32 tensors (1 to 4001 elements)]\n";
  run_list("gpu/1000small", small, std::max(opts.min_reps, 10), 50, out);
}

#endif  // AMPACTOR_CUDA_BUILT

}  // namespace ampactor::bench
