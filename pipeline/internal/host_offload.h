// The model on an accelerator, its masters and the optimizer on the CPU (RoundPipe's setting):
// pinned host copies of the grads and the weights, moved on two streams of their own and ordered
// by events, so neither the trainer nor the GPU ever waits for a host-wide sync.
//
// Written against c10's device-generic streams and events, so it builds with any LibTorch; at
// run time it needs one with the model's device (CUDA) compiled in.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <memory>
#include <vector>

namespace ampactor::internal {

class HostOffload {
 public:
  /// `model`: the model's parameters, all on one non-CPU device. Throws std::invalid_argument
  /// otherwise, and when this LibTorch lacks that device type.
  explicit HostOffload(const std::vector<at::Tensor>& model);
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  /// Trainer thread, after backward: queues on the copy-out stream the grads' copy into pinned
  /// host memory, and, when `model` is given and weights were staged since the last call, on the
  /// copy-in stream the staged weights' copy into the model; both behind everything queued so
  /// far on the current stream (the last backward writes the grads and reads the weights), and
  /// both at once. The current stream then waits for them: the next forward runs on the new
  /// weights, and the next backward may rewrite or free the grads at once. An undefined grad
  /// stays undefined. `grads` may be null: the weights only.
  /// `sent`: grads already on their way (send_grads), not copied again.
  void exchange(const std::vector<at::Tensor>* grads, const std::vector<at::Tensor>* model,
                const std::vector<bool>* sent = nullptr);
  /// The thread running backward (overlap_backward): queues on the copy-out stream, behind the
  /// calling thread's current stream, the copy of the parameters `which`'s grads (`grads`, in
  /// that order) into their pinned host copies, which it returns in `host`; the event marks
  /// their landing. An undefined grad stays undefined.
  std::shared_ptr<c10::Event> send_grads(const std::vector<std::size_t>& which,
                                         const std::vector<at::Tensor>& grads,
                                         std::vector<at::Tensor>& host);
  /// Blocks the calling thread alone until `e` has happened on its device.
  static void wait(const c10::Event& e);
  /// Optimizer thread: blocks this thread alone until the last exchange's grad copies have
  /// landed, then returns the host copies (the model's grad dtype, pinned).
  const std::vector<at::Tensor>& receive_grads();
  /// Optimizer thread: writes the masters into the pinned host weights (cast to the model's
  /// dtype), once the last exchange has finished reading them.
  void stage_weights(const std::vector<at::Tensor>& masters);
  /// Optimizer thread: the pinned host weights, for a fused step to write in place, once the
  /// last exchange has finished reading them. Call weights_written() once they hold the step's
  /// weights, or stage_weights() where the step wrote none (a skipped step).
  std::vector<at::Tensor>& weights_to_write();
  void weights_written() { staged_.store(true, std::memory_order_release); }

  // ---- overlap_backward: the weights staged on the device as each bucket is stepped ----
  /// Makes the device copy of the weights that stage_early() fills (the model's dtype), once.
  void keep_device_spare();
  /// Optimizer thread: queues on the copy-in stream the copy of the pinned weights of the
  /// parameters `which` into the device copy, without waiting.
  void stage_early(const std::vector<std::size_t>& which);
  /// Optimizer thread: the pinned weights without waiting for the copy-in stream, for a step
  /// that writes weights no queued copy reads (weights_to_write() waited once this iteration).
  std::vector<at::Tensor>& weights_unsynced() { return weights_; }
  /// weights_written(), where early[i] says that parameter i's staged copy holds its weights:
  /// the next exchange copies it on the device instead of from the host.
  void weights_written(std::vector<bool> early);
  std::int64_t device_spare_bytes() const;
  /// The pinned host weights themselves (shard_optimizer_state makes them views of its flat
  /// buffer; they hold nothing until the first stage or copy into them).
  std::vector<at::Tensor>& host_weights() { return weights_; }

  c10::Device device() const { return device_; }

 private:
  /// On the copy-out stream: grad g into parameter i's pinned copy.
  void copy_out(std::size_t i, const at::Tensor& g);

  c10::Device device_;
  c10::Stream out_;                       // device -> host: the grads
  c10::Stream in_;                        // host -> device: the weights
  std::vector<at::Tensor> grads_;         // pinned, the model's grad dtype
  std::vector<at::Tensor> weights_;       // pinned, the model's dtype
  std::atomic<bool> staged_{false};       // weights_ holds weights the model has not received
  std::vector<at::Tensor> device_spare_;  // overlap_backward: the weights staged early
  std::vector<bool> early_;               // published with staged_: device_spare_[i] is current
};

}  // namespace ampactor::internal
