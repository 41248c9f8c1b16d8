// The demo's workload: a character-level language model (an MLP over a window of characters) on
// the license texts every Debian machine has. On the CPU, fp16 is emulated: weights and their
// gradients are stored in Half, and activations and their gradients are rounded through Half at
// every layer boundary (LibTorch 1.13 has no fp16 matmul on the CPU), which reproduces fp16's
// range: gradients below ~6e-8 become zero, values above 65504 become inf.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace demo {

/// The text, its alphabet, and batches of (window of chars -> next char).
class Corpus {
 public:
  /// Reads every regular file under `dir`. Throws std::runtime_error when there is no text.
  explicit Corpus(const std::string& dir);
  std::int64_t vocab() const { return std::int64_t(alphabet_.size()); }
  std::size_t size() const { return ids_.size(); }
  std::size_t files() const { return files_; }
  /// A batch from the training part (the first 90%) or the held-out part. Returns
  /// (inputs [batch, context] int64, targets [batch] int64).
  std::pair<at::Tensor, at::Tensor> batch(std::mt19937_64& rng, std::int64_t batch,
                                          std::int64_t context, bool held_out) const;

 private:
  std::vector<std::uint8_t> alphabet_;
  std::vector<std::int64_t> ids_;
  std::size_t files_ = 0;
};

struct ModelShape {
  std::int64_t vocab = 0;
  std::int64_t context = 12;
  std::int64_t embed = 24;
  std::int64_t hidden = 256;
  std::int64_t layers = 1;  // hidden layers (Linear -> tanh each)
};

/// Embedding -> (Linear -> tanh) x layers -> Linear, as plain tensors.
class CharMlp {
 public:
  /// dtype kHalf: fp16 storage, and fp16 arithmetic: real on a CUDA device, emulated on the CPU;
  /// kFloat: plain fp32. The weights are drawn on the CPU, so every device starts alike.
  CharMlp(const ModelShape& shape, at::ScalarType dtype, std::uint64_t seed,
          at::Device device = at::kCPU);
  std::vector<at::Tensor>& parameters() { return params_; }
  /// The parameters by name, as a torch::nn::Module's named_parameters() (for the scaler's
  /// overflow reports): embed, hidden.weight, hidden.bias, (hidden2.weight, hidden2.bias, ...),
  /// out.weight, out.bias.
  torch::OrderedDict<std::string, at::Tensor> named_parameters() const;
  at::ScalarType dtype() const { return dtype_; }
  /// Mean cross-entropy of the next character (computed in fp32, as autocast does).
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) const;
  /// The same loss in plain fp32 math with the given weights (e.g. fp32 masters), no rounding.
  static at::Tensor loss_fp32(const std::vector<at::Tensor>& weights, const at::Tensor& inputs,
                              const at::Tensor& targets);
  void zero_grad();

 private:
  at::ScalarType dtype_;
  bool real_half_;                  // fp16 kernels exist (CUDA): no emulation
  std::vector<at::Tensor> params_;  // E, W1, b1, ..., Wout, bout
};

/// Counts, at every fp16 layer boundary of the backward pass, the gradient elements that are
/// non-zero before rounding to Half and zero after it: activation gradients lost to underflow.
/// Off unless a probe is alive; one at a time.
class BoundaryProbe {
 public:
  BoundaryProbe();
  ~BoundaryProbe();
  BoundaryProbe(const BoundaryProbe&) = delete;
  BoundaryProbe& operator=(const BoundaryProbe&) = delete;
  double nonzero() const { return nonzero_; }
  double lost() const { return lost_; }
  static void count(const at::Tensor& before, const at::Tensor& after);

 private:
  double nonzero_ = 0, lost_ = 0;
};

/// Of the gradient elements that are non-zero in exact fp32 math, the share that are zero in
/// `grads` (the model's fp16 gradients after backward): what fp16 lost to underflow.
double underflow_fraction(const std::vector<at::Tensor>& grads,
                          const std::vector<at::Tensor>& fp32_grads);

}  // namespace demo
