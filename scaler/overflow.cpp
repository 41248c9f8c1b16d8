#include <ampactor/kernels/unscale.h>
#include <ampactor/scaler/overflow.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>

namespace ampactor {

struct ParameterNames::Guarded {
  mutable std::mutex mu;
  std::unordered_map<const void*, std::string> names;
};

ParameterNames::ParameterNames() : g_(std::make_unique<Guarded>()) {}
ParameterNames::~ParameterNames() = default;

ParameterNames::ParameterNames(const ParameterNames& o) : ParameterNames() {
  const std::lock_guard<std::mutex> lock(o.g_->mu);
  g_->names = o.g_->names;
}

ParameterNames& ParameterNames::operator=(const ParameterNames& o) {
  if (this == &o) return *this;
  std::unordered_map<const void*, std::string> copy;
  {
    const std::lock_guard<std::mutex> lock(o.g_->mu);
    copy = o.g_->names;
  }
  const std::lock_guard<std::mutex> lock(g_->mu);
  g_->names = std::move(copy);
  return *this;
}

void ParameterNames::add(const torch::OrderedDict<std::string, at::Tensor>& named) {
  for (const auto& item : named)
    add(item.key(), item.value());
}

void ParameterNames::add(const std::string& name, const at::Tensor& parameter) {
  const std::lock_guard<std::mutex> lock(g_->mu);
  g_->names[parameter.unsafeGetTensorImpl()] = name;
}

std::string ParameterNames::of(const at::Tensor& parameter, std::size_t index) const {
  const std::lock_guard<std::mutex> lock(g_->mu);
  auto it = g_->names.find(parameter.unsafeGetTensorImpl());
  return it != g_->names.end() ? it->second : "param " + std::to_string(index);
}

namespace {

/// The largest finite |g| (a sparse gradient's values), 0 for none.
double finite_absmax(at::Tensor g) {
  if (g.is_sparse()) g = g._values();
  if (g.numel() == 0) return 0;
  const at::Tensor a = g.detach().abs().to(at::kDouble);
  return at::where(at::isfinite(a), a, at::zeros_like(a)).max().item<double>();
}

std::vector<at::Tensor> params_of(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& group : opt.param_groups())
    for (const at::Tensor& p : group.params())
      out.push_back(p);
  return out;
}

/// The attribution of a record whose path checked without it (the pipeline's moves and fused
/// checks): the gradients it checked (a fused check's own list, else the parameters' gradients,
/// where the move put them) checked again, on an iteration that overflowed only.
std::vector<Attributed> attribute(const OptimizerRecord& rec, const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> grads;
  if (const AtScale* checked = std::get_if<AtScale>(&rec.grads); checked && !checked->grads.empty())
    grads = checked->grads;
  else
    for (const at::Tensor& p : ps)
      grads.push_back(p.grad());
  std::vector<std::pair<c10::Device, Attributed>> per_device;
  std::vector<std::vector<at::Tensor>> lists;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    at::Tensor g = grads[i];
    if (!g.defined()) continue;
    if (g.is_sparse()) g = g._values();
    auto it = std::find_if(per_device.begin(), per_device.end(),
                           [&](const auto& e) { return e.first == g.device(); });
    if (it == per_device.end()) {
      it = per_device.insert(per_device.end(), {g.device(), {}});
      lists.emplace_back();
    }
    it->second.params.push_back(i);
    lists[std::size_t(it - per_device.begin())].push_back(g);
  }
  std::vector<Attributed> out;
  for (std::size_t d = 0; d < per_device.size(); ++d) {
    const auto on = at::TensorOptions().device(per_device[d].first);
    at::Tensor f = at::zeros({}, on.dtype(at::kFloat));
    Attributed a = std::move(per_device[d].second);
    a.flags = at::zeros({std::int64_t(lists[d].size())}, on.dtype(at::kByte));
    kernels::check_finite(lists[d], f, kernels::Measures().nonfinite(a.flags));
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

std::vector<OverflowTensor> overflow_of(const StepTracker& tracker,
                                        const torch::optim::Optimizer& opt, double scale,
                                        const ParameterNames& names) {
  auto it = tracker.records().find(&opt);
  if (it == tracker.records().end() || !it->second.any_found_inf()) return {};
  const OptimizerRecord& rec = it->second;
  const std::vector<at::Tensor> ps = params_of(opt);
  const std::vector<Attributed> late =
      rec.nonfinite.empty() ? attribute(rec, ps) : std::vector<Attributed>{};
  std::vector<OverflowTensor> found;
  for (const Attributed& a : rec.nonfinite.empty() ? late : rec.nonfinite) {
    const at::Tensor flags = a.flags.cpu();
    for (std::size_t j = 0; j < a.params.size(); ++j) {
      const std::uint8_t f = flags.data_ptr<std::uint8_t>()[j];
      if (!f) continue;
      OverflowTensor t;
      t.index = a.params[j];
      t.name = names.of(ps[t.index], t.index);
      t.inf = f & kernels::kHeldInf;
      t.nan = f & kernels::kHeldNaN;
      double m = -1;
      for (std::size_t n : {t.index - 1, t.index + 1})
        if (n < ps.size() && ps[n].grad().defined())
          m = std::max(m, finite_absmax(ps[n].grad()) / (rec.at_scale() ? scale : 1.0));
      if (m >= 0) t.neighbours_max = m;
      found.push_back(std::move(t));
    }
  }
  sort_overflow(found);
  return found;
}

void sort_overflow(std::vector<OverflowTensor>& ts) {
  std::sort(ts.begin(), ts.end(), [](const OverflowTensor& a, const OverflowTensor& b) {
    return a.index != b.index ? a.index < b.index : a.name < b.name;
  });
}

OverflowReport overflow_report(const StepTracker& tracker, double scale,
                               const ParameterNames& names, std::int64_t iteration) {
  OverflowReport r;
  r.iteration = iteration;
  r.scale = scale;
  for (const auto& entry : tracker.records()) {
    std::vector<OverflowTensor> ts = overflow_of(tracker, *entry.first, scale, names);
    r.tensors.insert(r.tensors.end(), ts.begin(), ts.end());
  }
  sort_overflow(r.tensors);
  return r;
}

}  // namespace ampactor
