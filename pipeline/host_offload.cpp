#include "internal/host_offload.h"
#include <ampactor/core/errors.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace ampactor::internal {

namespace {

c10::Device one_device(const std::vector<at::Tensor>& model) {
  if (model.empty())
    throw ScalerError(errc::bad_parameters,
                      "AsyncOptimizer: offloading needs at least one parameter");
  const c10::Device d = model[0].device();
  for (std::size_t i = 0; i < model.size(); ++i)
    if (!model[i].defined() || model[i].device() != d)
      throw ScalerError(errc::bad_parameters,
                        "AsyncOptimizer: offloading needs every model parameter on one "
                        "device; parameter " +
                            std::to_string(i) + " is not on " + d.str());
  if (d.is_cpu())
    throw ScalerError(
        errc::bad_parameters,
        "AsyncOptimizer: the model is on the CPU; masters on the CPU need no offloading");
  return d;
}

c10::Stream pool_stream(c10::Device d) {
  try {
    return c10::impl::VirtualGuardImpl(d.type()).getStreamFromGlobalPool(d);
  } catch (const c10::Error& e) {
    throw ScalerError(errc::bad_parameters, "AsyncOptimizer: no streams for " + d.str() + ": " +
                                                e.what_without_backtrace());
  }
}

at::Tensor pinned_like(const at::Tensor& t, at::ScalarType dtype) {
  return at::empty(t.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(true));
}

c10::Stream current_stream(c10::Device d) {
  return c10::impl::VirtualGuardImpl(d.type()).getStream(d);
}

/// `waiter` waits for the work queued on `on` so far, without the host waiting.
void order_after(const c10::Stream& on, const c10::Stream& waiter) {
  c10::Event e(on.device_type());
  e.record(on);
  e.block(waiter);
}

/// Event::synchronize where this LibTorch has it (2.x); else a poll of query().
template <class E>
auto synchronize(const E& e, int) -> decltype(e.synchronize(), void()) {
  e.synchronize();
}
template <class E>
void synchronize(const E& e, long) {
  while (!e.query())
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

}  // namespace

HostOffload::HostOffload(const std::vector<at::Tensor>& model)
    : device_(one_device(model)), out_(pool_stream(device_)), in_(pool_stream(device_)) {
  at::AutoGradMode no_grad(false);
  grads_.resize(model.size());
  for (const at::Tensor& p : model)
    weights_.push_back(pinned_like(p, p.scalar_type()));
}

void HostOffload::exchange(const std::vector<at::Tensor>* grads,
                           const std::vector<at::Tensor>* model, const std::vector<bool>* sent) {
  if (grads && grads->size() != grads_.size())
    throw ScalerError(errc::bad_parameters, "AsyncOptimizer: " + std::to_string(grads->size()) +
                                                " grads for " + std::to_string(grads_.size()) +
                                                " parameters");
  const bool publish = model && staged_.exchange(false, std::memory_order_acq_rel);
  if (!grads && !publish) return;
  at::AutoGradMode no_grad(false);
  c10::DeviceGuard on_device(device_);
  const c10::Stream compute = current_stream(device_);
  c10::Event computed(device_.type());
  computed.record(compute);
  if (grads) {
    computed.block(out_);
    c10::StreamGuard on_out(out_);
    for (std::size_t i = 0; i < grads->size(); ++i)
      if (!sent || !(*sent)[i]) copy_out(i, (*grads)[i]);
  }
  if (publish) {
    computed.block(in_);
    c10::StreamGuard on_in(in_);
    for (std::size_t i = 0; i < weights_.size(); ++i)
      (*model)[i].detach().copy_(!early_.empty() && early_[i] ? device_spare_[i] : weights_[i],
                                 /*non_blocking=*/true);
    early_.clear();
  }
  // The current stream goes on once the copies are done: the grads' memory may then be reused
  // or rewritten, and the model's weights are the new ones.
  if (grads) order_after(out_, compute);
  if (publish) order_after(in_, compute);
}

void HostOffload::copy_out(std::size_t i, const at::Tensor& g) {
  if (!g.defined()) {
    grads_[i] = at::Tensor();
    return;
  }
  if (!grads_[i].defined() || grads_[i].sizes() != g.sizes() ||
      grads_[i].scalar_type() != g.scalar_type())
    grads_[i] = pinned_like(g, g.scalar_type());
  grads_[i].copy_(g, /*non_blocking=*/true);
}

std::shared_ptr<c10::Event> HostOffload::send_grads(const std::vector<std::size_t>& which,
                                                    const std::vector<at::Tensor>& grads,
                                                    std::vector<at::Tensor>& host) {
  at::AutoGradMode no_grad(false);
  c10::DeviceGuard on_device(device_);
  c10::Event computed(device_.type());
  computed.record(current_stream(device_));  // where backward accumulated these grads
  computed.block(out_);
  c10::StreamGuard on_out(out_);
  host.clear();
  for (std::size_t j = 0; j < which.size(); ++j) {
    copy_out(which[j], grads[j]);
    host.push_back(grads_[which[j]]);
  }
  auto landed = std::make_shared<c10::Event>(device_.type());
  landed->record(out_);
  return landed;
}

void HostOffload::wait(const c10::Event& e) {
  synchronize(e, 0);
}

const std::vector<at::Tensor>& HostOffload::receive_grads() {
  out_.synchronize();
  return grads_;
}

std::vector<at::Tensor>& HostOffload::weights_to_write() {
  in_.synchronize();  // the last exchange has read weights_
  return weights_;
}

void HostOffload::stage_weights(const std::vector<at::Tensor>& masters) {
  in_.synchronize();  // the last exchange has read weights_
  at::AutoGradMode no_grad(false);
  for (std::size_t i = 0; i < weights_.size(); ++i)
    weights_[i].copy_(masters[i].detach());
  early_.clear();
  staged_.store(true, std::memory_order_release);
}

void HostOffload::keep_device_spare() {
  if (!device_spare_.empty()) return;
  at::AutoGradMode no_grad(false);
  for (const at::Tensor& w : weights_)
    device_spare_.push_back(at::empty(w.sizes(), w.options().device(device_).pinned_memory(false)));
}

void HostOffload::stage_early(const std::vector<std::size_t>& which) {
  at::AutoGradMode no_grad(false);
  c10::DeviceGuard on_device(device_);
  c10::StreamGuard on_in(in_);
  for (std::size_t i : which)
    device_spare_[i].copy_(weights_[i], /*non_blocking=*/true);
}

void HostOffload::weights_written(std::vector<bool> early) {
  early_ = std::move(early);
  staged_.store(true, std::memory_order_release);
}

std::int64_t HostOffload::device_spare_bytes() const {
  std::int64_t n = 0;
  for (const at::Tensor& t : device_spare_)
    n += std::int64_t(t.nbytes());
  return n;
}

}  // namespace ampactor::internal
