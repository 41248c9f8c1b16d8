// CPU entry points: validate everything first (so bad input changes nothing), describe each tensor
// as rows of strided elements, cut the work into chunks and run them in parallel.
#include <ampactor/core/errors.h>
#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../cuda/dispatch.h"
#include "cpu_features.h"
#include "layout.h"
#include "loops.h"
#include "pool.h"

namespace ampactor::kernels {
namespace cpu {

const LoopTable& loops() {
  static const LoopTable& chosen = []() -> const LoopTable& {
    switch (pick_isa()) {
      case Isa::avx512:
        return avx512_loops();
      case Isa::avx2:
        return avx2_loops();
      default:
        return baseline_loops();
    }
  }();
  return chosen;
}

}  // namespace cpu

namespace {

using cpu::ElemType;
using cpu::kMaxDims;
using cpu::Layout;
using cpu::make_layout;
using cpu::non_overlapping;

// Chunk of work handed to one thread at a time: large enough to amortise dispatch, small enough
// to balance a list of mixed sizes.
constexpr std::int64_t kChunkElems = 1 << 16;
// Below this many elements in total, threads cost more than they save.
constexpr std::int64_t kParallelMinElems = 1 << 19;

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

std::size_t elem_size(ElemType t) {
  return t == ElemType::f64 ? 8 : t == ElemType::f32 ? 4 : 2;
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

void check_grad(const char* op, const Name& name, const at::Tensor& t, const c10::Device& device,
                bool written) {
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

/// One operand of a task: a base pointer, its element type and its layout slot.
struct Operand {
  char* base;
  ElemType type;
};

struct Job {
  Layout layout;
  Operand a;  // the gradient (or the model grad for a move)
  Operand b;  // the master grad for a move
};

struct Task {
  std::uint32_t job;
  std::int64_t row_begin, row_end, col_begin, col_end;
};

enum class Op { unscale, check, move };

std::vector<Task> make_tasks(const std::vector<Job>& jobs, std::int64_t* total) {
  std::vector<Task> tasks;
  *total = 0;
  for (std::uint32_t j = 0; j < jobs.size(); ++j) {
    const Layout& l = jobs[j].layout;
    *total += l.rows * l.cols;
    if (l.rows == 0 || l.cols == 0) continue;
    if (l.rows == 1) {
      for (std::int64_t c = 0; c < l.cols; c += kChunkElems)
        tasks.push_back({j, 0, 1, c, std::min(l.cols, c + kChunkElems)});
    } else {
      std::int64_t per = std::max<std::int64_t>(1, kChunkElems / l.cols);
      for (std::int64_t r = 0; r < l.rows; r += per)
        tasks.push_back({j, r, std::min(l.rows, r + per), 0, l.cols});
    }
  }
  return tasks;
}

/// `absmax`: null for the plain loops, else the task's running max for the *_max loops.
bool run_task(Op op, const Job& job, const Task& task, float inv, const cpu::LoopTable& lt,
              float* absmax) {
  const Layout& l = job.layout;
  const std::size_t ea = elem_size(job.a.type);
  bool bad = false;
  for (std::int64_t r = task.row_begin; r < task.row_end; ++r) {
    char* pa = job.a.base + (l.row_offset(0, r) + task.col_begin * l.col_stride[0]) * ea;
    const std::int64_t n = task.col_end - task.col_begin;
    switch (op) {
      case Op::unscale:
        bad |=
            (absmax ? lt.unscale_max : lt.unscale)(job.a.type, pa, n, l.col_stride[0], inv, absmax);
        break;
      case Op::check:
        bad |= (absmax ? lt.check_max : lt.check)(job.a.type, pa, n, l.col_stride[0], absmax);
        break;
      case Op::move: {
        float* pb = reinterpret_cast<float*>(job.b.base) + l.row_offset(1, r) +
                    task.col_begin * l.col_stride[1];
        bad |= (absmax ? lt.move_max : lt.move)(job.a.type, pa, l.col_stride[0], pb,
                                                l.col_stride[1], n, inv, absmax);
        break;
      }
    }
  }
  return bad;
}

/// Runs every job; returns whether any element was inf or NaN. With `absmax`, raises it to the
/// largest finite |element| read (threads keep their own max and merge once at the end).
bool run(Op op, const std::vector<Job>& jobs, float inv, float* absmax) {
  std::int64_t total = 0;
  const std::vector<Task> tasks = make_tasks(jobs, &total);
  const cpu::LoopTable& lt = cpu::loops();
  if (total < kParallelMinElems || at::get_num_threads() == 1 || at::in_parallel_region()) {
    bool bad = false;
    for (const Task& t : tasks)
      bad |= run_task(op, jobs[t.job], t, inv, lt, absmax);
    return bad;
  }
  // As the fused step that may follow: on the main thread's OpenMP team, else on the kernels'
  // own pool (pool.h's run_shares says why).
  std::atomic<bool> found{false};
  std::mutex mu;
  const std::int64_t count = std::int64_t(tasks.size());
  cpu::run_shares(at::get_num_threads(), [&](int t, int nt) {
    bool bad = false;
    float mx = 0;
    for (std::int64_t i = count * t / nt; i < count * (t + 1) / nt; ++i)
      bad |= run_task(op, jobs[tasks[std::size_t(i)].job], tasks[std::size_t(i)], inv, lt,
                      absmax ? &mx : nullptr);
    if (bad) found.store(true, std::memory_order_relaxed);
    if (absmax && mx > 0) {
      const std::lock_guard<std::mutex> lock(mu);
      if (mx > *absmax) *absmax = mx;
    }
  });
  return found.load();
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

/// Runs the loops, raising the host tensor `absmax` (when given) through a local float.
bool run_cpu(Op op, const std::vector<Job>& jobs, float inv, at::Tensor* absmax) {
  if (!absmax) return run(op, jobs, inv, nullptr);
  float mx = absmax->data_ptr<float>()[0];
  const bool bad = run(op, jobs, inv, &mx);
  absmax->data_ptr<float>()[0] = mx;
  return bad;
}

void unscale_impl(const char* op, at::TensorList grads, const at::Tensor* inv_tensor, float inv,
                  at::Tensor& found_inf, at::Tensor* absmax) {
  const c10::Device device = common_device(grads, found_inf);
  check_scalar_tensor(op, "found_inf", found_inf, device);
  check_absmax(op, absmax, found_inf);
  check_device_supported(op, device);  // before any data pointer is read on the host
  const bool on_cuda = device.is_cuda();
  if (inv_tensor && on_cuda) check_scalar_tensor(op, "inv_scale", *inv_tensor, device);
  if (inv_tensor && !on_cuda) inv = read_inv_scale(op, *inv_tensor, device);
  // Check-only when the multiply is the identity: one read, no write. A device inv_scale is read
  // by the kernel, not here, so the gradients must then be writable.
  const bool write = (on_cuda && inv_tensor) || inv != 1.0f;
  std::vector<Job> jobs;
  jobs.reserve(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Name name{"grads", i};
    check_grad(op, name, grads[i], device, write);
    jobs.push_back({make_layout(grads[i], nullptr),
                    {static_cast<char*>(grads[i].data_ptr()), elem_type(op, name, grads[i])},
                    {nullptr, ElemType::f32}});
  }
  if (on_cuda)
    internal::cuda_unscale(op, grads, inv_tensor, inv, found_inf, !write, absmax);
  else if (run_cpu(write ? Op::unscale : Op::check, jobs, inv, absmax))
    set_found(found_inf);
  if (write) bump_versions(grads);
}

void move_impl(at::TensorList model_grads, at::TensorList master_grads,
               const at::Tensor* inv_tensor, float inv, at::Tensor& found_inf, at::Tensor* absmax) {
  const char* op = "move_grads_and_unscale";
  const c10::Device device = common_device(model_grads, found_inf);
  check_scalar_tensor(op, "found_inf", found_inf, device);
  check_absmax(op, absmax, found_inf);
  check_device_supported(op, device);  // before any data pointer is read on the host
  const bool on_cuda = device.is_cuda();
  if (inv_tensor && on_cuda) check_scalar_tensor(op, "inv_scale", *inv_tensor, device);
  if (inv_tensor && !on_cuda) inv = read_inv_scale(op, *inv_tensor, device);
  if (model_grads.size() != master_grads.size())
    fail(op, "got " + std::to_string(model_grads.size()) + " model grads but " +
                 std::to_string(master_grads.size()) + " master grads");
  std::vector<Job> jobs;
  jobs.reserve(model_grads.size());
  for (std::size_t i = 0; i < model_grads.size(); ++i) {
    const Name model_name{"model_grads", i};
    const Name master_name{"master_grads", i};
    const at::Tensor& model = model_grads[i];
    const at::Tensor& master = master_grads[i];
    check_grad(op, model_name, model, device, false);
    check_grad(op, master_name, master, device, true);
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
    internal::cuda_move(op, model_grads, master_grads, inv_tensor, inv, found_inf, absmax);
  else if (run_cpu(Op::move, jobs, inv, absmax))
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

const char* cpu_loop_variant() {
  return cpu::loops().name;
}

}  // namespace ampactor::kernels
