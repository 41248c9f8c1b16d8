#include "charlm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace demo {

Corpus::Corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error("no such directory: " + dir);
  std::vector<fs::path> paths;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink()) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());  // the same text in the same order everywhere
  std::string text;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ++files_;
  }
  if (text.size() < 10000)
    throw std::runtime_error("too little text under " + dir + " (" + std::to_string(text.size()) +
                             " bytes); pass --text-dir with a folder of text files");
  std::array<std::int64_t, 256> index{};
  index.fill(-1);
  for (unsigned char c : text)
    if (index[c] < 0) index[c] = 0;
  for (int c = 0; c < 256; ++c)
    if (index[std::size_t(c)] == 0) {
      index[std::size_t(c)] = std::int64_t(alphabet_.size());
      alphabet_.push_back(std::uint8_t(c));
    }
  ids_.reserve(text.size());
  for (unsigned char c : text)
    ids_.push_back(index[c]);
}

std::pair<at::Tensor, at::Tensor> Corpus::batch(std::mt19937_64& rng, std::int64_t batch,
                                                std::int64_t context, bool held_out) const {
  const std::size_t split = ids_.size() * 9 / 10;
  const std::size_t lo = held_out ? split : 0;
  const std::size_t hi = (held_out ? ids_.size() : split) - std::size_t(context) - 1;
  std::uniform_int_distribution<std::size_t> pick(lo, hi);
  std::vector<std::int64_t> in(static_cast<std::size_t>(batch * context));
  std::vector<std::int64_t> out(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::size_t at = pick(rng);
    for (std::int64_t c = 0; c < context; ++c)
      in[std::size_t(b * context + c)] = ids_[at + std::size_t(c)];
    out[std::size_t(b)] = ids_[at + std::size_t(context)];
  }
  auto opt = at::TensorOptions().dtype(at::kLong);
  return {at::from_blob(in.data(), {batch, context}, opt).clone(),
          at::from_blob(out.data(), {batch}, opt).clone()};
}

namespace {
BoundaryProbe* active_probe = nullptr;  // the demo's backward runs on the main thread only
}  // namespace

BoundaryProbe::BoundaryProbe() {
  if (active_probe) throw std::logic_error("one BoundaryProbe at a time");
  active_probe = this;
}
BoundaryProbe::~BoundaryProbe() {
  active_probe = nullptr;
}

void BoundaryProbe::count(const at::Tensor& before, const at::Tensor& after) {
  BoundaryProbe* p = active_probe;
  if (!p) return;
  at::Tensor nz = before != 0;
  p->nonzero_ += double(nz.sum().item<std::int64_t>());
  p->lost_ += double((nz & (after == 0)).sum().item<std::int64_t>());
}

namespace {

/// Rounds through Half in the forward pass and rounds the gradient through Half in the backward
/// pass: an fp16 layer boundary.
struct HalfRound : torch::autograd::Function<HalfRound> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.to(at::kHalf).to(at::kFloat);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    at::Tensor r = g[0].to(at::kHalf).to(at::kFloat);
    BoundaryProbe::count(g[0], r);
    return {r};
  }
};

at::Tensor forward(const std::vector<at::Tensor>& w, const at::Tensor& inputs,
                   const at::Tensor& targets, bool half, bool real_half) {
  const std::size_t out = w.size() - 2;  // E, then (W, b) per hidden layer, then Wout, bout
  const std::int64_t batch = inputs.size(0);
  if (real_half) {  // fp16 weights and fp16 kernels; the loss in fp32
    at::Tensor h = at::index_select(w[0], 0, inputs.reshape({-1})).view({batch, -1});
    for (std::size_t l = 1; l < out; l += 2)
      h = at::tanh(at::matmul(h, w[l]) + w[l + 1]);
    return at::cross_entropy_loss((at::matmul(h, w[out]) + w[out + 1]).to(at::kFloat), targets);
  }
  auto r = [half](const at::Tensor& x) { return half ? HalfRound::apply(x) : x; };
  // Casting a Half parameter to float is differentiable: its gradient comes back as Half.
  auto f = [](const at::Tensor& p) { return p.scalar_type() == at::kFloat ? p : p.to(at::kFloat); };
  at::Tensor h = r(at::index_select(f(w[0]), 0, inputs.reshape({-1})).view({batch, -1}));
  for (std::size_t l = 1; l < out; l += 2)
    h = r(at::tanh(r(at::matmul(h, f(w[l])) + f(w[l + 1]))));
  at::Tensor logits = r(at::matmul(h, f(w[out])) + f(w[out + 1]));
  return at::cross_entropy_loss(logits, targets);
}

}  // namespace

CharMlp::CharMlp(const ModelShape& shape, at::ScalarType dtype, std::uint64_t seed,
                 at::Device device)
    : dtype_(dtype), real_half_(dtype == at::kHalf && device.is_cuda()) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto init = [&](std::vector<std::int64_t> sizes, double sd) {
    at::Tensor t = at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)) * sd;
    return t.to(device, dtype_).set_requires_grad(true);
  };
  auto zeros = [&](std::int64_t n) {
    return at::zeros({n}, at::TensorOptions().dtype(dtype_).device(device)).set_requires_grad(true);
  };
  params_.push_back(init({shape.vocab, shape.embed}, 1.0));
  for (std::int64_t l = 0; l < shape.layers; ++l) {
    const std::int64_t in = l == 0 ? shape.context * shape.embed : shape.hidden;
    params_.push_back(init({in, shape.hidden}, 1.0 / std::sqrt(double(in))));
    params_.push_back(zeros(shape.hidden));
  }
  params_.push_back(init({shape.hidden, shape.vocab}, 1.0 / std::sqrt(double(shape.hidden))));
  params_.push_back(zeros(shape.vocab));
}

at::Tensor CharMlp::loss(const at::Tensor& inputs, const at::Tensor& targets) const {
  return forward(params_, inputs, targets, dtype_ == at::kHalf, real_half_);
}

at::Tensor CharMlp::loss_fp32(const std::vector<at::Tensor>& weights, const at::Tensor& inputs,
                              const at::Tensor& targets) {
  return forward(weights, inputs, targets, false, false);
}

torch::OrderedDict<std::string, at::Tensor> CharMlp::named_parameters() const {
  torch::OrderedDict<std::string, at::Tensor> out;
  out.insert("embed", params_[0]);
  const std::size_t last = params_.size() - 2;
  for (std::size_t l = 1; l < last; l += 2) {
    const std::string layer = l == 1 ? "hidden" : "hidden" + std::to_string(l / 2 + 1);
    out.insert(layer + ".weight", params_[l]);
    out.insert(layer + ".bias", params_[l + 1]);
  }
  out.insert("out.weight", params_[last]);
  out.insert("out.bias", params_[last + 1]);
  return out;
}

void CharMlp::zero_grad() {
  for (auto& p : params_)
    p.mutable_grad() = at::Tensor();
}

double underflow_fraction(const std::vector<at::Tensor>& grads,
                          const std::vector<at::Tensor>& fp32_grads) {
  double lost = 0, nonzero = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || !fp32_grads[i].defined()) continue;
    at::Tensor ref = fp32_grads[i] != 0;
    nonzero += double(ref.sum().item<std::int64_t>());
    lost += double((ref & (grads[i] == 0)).sum().item<std::int64_t>());
  }
  return nonzero > 0 ? lost / nonzero : 0.0;
}

}  // namespace demo
