#include "gpt_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>

#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>

namespace ampactor::bench {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

GptCorpus::GptCorpus(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the text " + file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (text.size() < 100000)
    throw std::runtime_error("too little text in " + file + " (" + std::to_string(text.size()) +
                             " bytes, 100000 needed)");
  std::array<std::int64_t, 256> index{};
  index.fill(-1);
  for (unsigned char c : text)
    index[c] = 0;
  for (auto& i : index)
    if (i == 0) i = std::int64_t(alphabet_++);
  ids_.reserve(text.size());
  for (unsigned char c : text)
    ids_.push_back(index[c]);
}

std::pair<at::Tensor, at::Tensor> GptCorpus::batch(std::uint64_t& state, std::int64_t batch,
                                                   std::int64_t context, bool held_out) const {
  const std::size_t split = ids_.size() * 9 / 10;
  const std::size_t lo = held_out ? split : 0;
  const std::size_t span = (held_out ? ids_.size() : split) - lo - std::size_t(context) - 1;
  std::vector<std::int64_t> x(std::size_t(batch * context)), y(x.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::size_t at = lo + std::size_t(splitmix64(state) % span);
    for (std::int64_t c = 0; c < context; ++c) {
      x[std::size_t(b * context + c)] = ids_[at + std::size_t(c)];
      y[std::size_t(b * context + c)] = ids_[at + std::size_t(c) + 1];
    }
  }
  const auto opt = at::TensorOptions().dtype(at::kLong);
  return {at::from_blob(x.data(), {batch, context}, opt).clone(),
          at::from_blob(y.data(), {batch, context}, opt).clone()};
}

std::vector<std::string> gpt_names(const GptShape& s) {
  std::vector<std::string> n = {"tok_emb", "pos_emb"};
  for (std::int64_t l = 0; l < s.layers; ++l)
    for (const char* p : {"ln1.w", "ln1.b", "qkv.w", "qkv.b", "out.w", "out.b", "ln2.w", "ln2.b",
                          "fc.w", "fc.b", "proj.w", "proj.b"})
      n.push_back("h" + std::to_string(l) + "." + p);
  for (const char* p : {"lnf.w", "lnf.b", "head"})
    n.push_back(p);
  return n;
}

std::vector<at::Tensor> gpt_init(const GptShape& s, std::uint64_t seed, at::ScalarType dtype,
                                 at::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const double resid = 0.02 / std::sqrt(2.0 * double(s.layers));
  std::vector<at::Tensor> w;
  auto randn = [&](std::vector<std::int64_t> sizes, double sd) {
    w.push_back(at::randn(sizes, gen, f32) * sd);
  };
  auto fill = [&](std::int64_t n, double v) {
    w.push_back(v ? at::ones({n}, f32) : at::zeros({n}, f32));
  };
  const std::int64_t d = s.embed;
  randn({s.vocab, d}, 0.02);
  randn({s.context, d}, 0.02);
  for (std::int64_t l = 0; l < s.layers; ++l) {
    fill(d, 1), fill(d, 0);
    randn({d, 3 * d}, 0.02), fill(3 * d, 0);
    randn({d, d}, resid), fill(d, 0);
    fill(d, 1), fill(d, 0);
    randn({d, 4 * d}, 0.02), fill(4 * d, 0);
    randn({4 * d, d}, resid), fill(d, 0);
  }
  fill(d, 1), fill(d, 0);
  randn({d, s.vocab}, 0.02);
  for (auto& t : w)
    t = t.to(device, dtype).set_requires_grad(true);
  return w;
}

at::Tensor gpt_loss(const std::vector<at::Tensor>& w, const GptShape& s, const at::Tensor& inputs,
                    const at::Tensor& targets) {
  const std::int64_t B = inputs.size(0), T = inputs.size(1), d = s.embed, H = s.heads;
  const std::int64_t dh = d / H;
  // Layer norm in fp32 with the fp16 weights widened, back to fp16 (as autocast runs it).
  auto norm = [&](const at::Tensor& x, std::size_t i) {
    return at::layer_norm(x.to(at::kFloat), {d}, w[i].to(at::kFloat), w[i + 1].to(at::kFloat), 1e-5)
        .to(at::kHalf);
  };
  const at::Tensor future =
      at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(inputs.device())).triu(1);
  at::Tensor x = at::embedding(w[0], inputs) + w[1].slice(0, 0, T);
  std::size_t i = 2;
  for (std::int64_t l = 0; l < s.layers; ++l, i += 12) {
    const at::Tensor qkv = at::matmul(norm(x, i), w[i + 2]) + w[i + 3];
    auto heads = [&](std::int64_t part) {
      return qkv.slice(2, part * d, (part + 1) * d).view({B, T, H, dh}).transpose(1, 2);
    };
    const at::Tensor q = heads(0), k = heads(1), v = heads(2);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(dh)));
    att = at::softmax(
              att.to(at::kFloat).masked_fill(future, -std::numeric_limits<double>::infinity()), -1)
              .to(at::kHalf);
    const at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({B, T, d});
    x = x + (at::matmul(y, w[i + 4]) + w[i + 5]);
    const at::Tensor m = at::gelu(at::matmul(norm(x, i + 6), w[i + 8]) + w[i + 9]);
    x = x + (at::matmul(m, w[i + 10]) + w[i + 11]);
  }
  const at::Tensor logits = at::matmul(norm(x, i), w[i + 2]);
  return at::cross_entropy_loss(logits.to(at::kFloat).view({B * T, s.vocab}),
                                targets.reshape({B * T}));
}

}  // namespace ampactor::bench
