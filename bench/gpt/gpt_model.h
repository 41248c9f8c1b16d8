// A small decoder-only transformer over characters (a GPT block stack), written as plain tensor
// code so that bench/gpt/gpt_torch.py can run the very same operations in PyTorch: the same weights
// (drawn from a seeded CPU generator in one fixed order), the same batches (splitmix64 over the
// text), the same fp16 kernels, layer norms and softmax in fp32, the loss in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ampactor::bench {

struct GptShape {
  std::int64_t vocab = 0;
  std::int64_t context = 128;
  std::int64_t embed = 256;
  std::int64_t heads = 4;  // embed / heads = 64: the attention's 1/sqrt(64) is exact in fp16
  std::int64_t layers = 4;
};

/// The text as byte ids over its alphabet (the sorted bytes that occur), and the batches.
class GptCorpus {
 public:
  /// Throws std::runtime_error when the file cannot be read or holds too little text.
  explicit GptCorpus(const std::string& file);
  std::int64_t vocab() const { return std::int64_t(alphabet_); }
  /// `batch` sequences of `context` ids from the first 90% (or, held out, the last 10%), each
  /// starting at splitmix64(state) % (span - context - 1): (inputs, targets shifted by one),
  /// int64 [batch, context] on the CPU.
  std::pair<at::Tensor, at::Tensor> batch(std::uint64_t& state, std::int64_t batch,
                                          std::int64_t context, bool held_out) const;

 private:
  std::vector<std::int64_t> ids_;
  std::size_t alphabet_ = 0;
};

/// The weights in their fixed order: token and position embeddings; per layer ln1 (w, b), qkv
/// (w, b), out (w, b), ln2 (w, b), fc (w, b), proj (w, b); the final ln (w, b); the head. Drawn
/// as fp32 on the CPU (randn * 0.02, the residual projections / sqrt(2 * layers); norms 1 and 0,
/// biases 0), then cast to `dtype` on `device`, requiring grad.
std::vector<at::Tensor> gpt_init(const GptShape& shape, std::uint64_t seed, at::ScalarType dtype,
                                 at::Device device);

/// The names of gpt_init's weights, in its order.
std::vector<std::string> gpt_names(const GptShape& shape);

/// Mean next-character cross-entropy; `w` are fp16 (the model's weights).
at::Tensor gpt_loss(const std::vector<at::Tensor>& w, const GptShape& shape,
                    const at::Tensor& inputs, const at::Tensor& targets);

std::uint64_t splitmix64(std::uint64_t& state);

}  // namespace ampactor::bench
