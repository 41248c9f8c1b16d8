#include <ampactor/kernels/unscale.h>
#include <ampactor/scaler/overflow.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace ampactor {

void ParameterNames::add(const torch::OrderedDict<std::string, at::Tensor>& named) {
  for (const auto& item : named)
    add(item.key(), item.value());
}

void ParameterNames::add(const std::string& name, const at::Tensor& parameter) {
  names_[parameter.unsafeGetTensorImpl()] = name;
}

std::string ParameterNames::of(const at::Tensor& parameter, std::size_t index) const {
  auto it = names_.find(parameter.unsafeGetTensorImpl());
  return it != names_.end() ? it->second : "param " + std::to_string(index);
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

}  // namespace

OverflowReport overflow_report(const StepTracker& tracker, double scale,
                               const ParameterNames& names, std::int64_t iteration) {
  OverflowReport r;
  r.iteration = iteration;
  r.scale = scale;
  for (const auto& [opt, rec] : tracker.records()) {
    const std::vector<at::Tensor> ps = params_of(*opt);
    std::vector<OverflowTensor> found;
    for (const Attributed& a : rec.nonfinite) {
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
            m = std::max(m, finite_absmax(ps[n].grad()) / (rec.at_scale ? scale : 1.0));
        if (m >= 0) t.neighbours_max = m;
        found.push_back(std::move(t));
      }
    }
    r.tensors.insert(r.tensors.end(), found.begin(), found.end());
  }
  std::sort(r.tensors.begin(), r.tensors.end(),
            [](const OverflowTensor& a, const OverflowTensor& b) {
              return a.index != b.index ? a.index < b.index : a.name < b.name;
            });
  return r;
}

std::string OverflowReport::str() const {
  std::ostringstream o;
  o << "iteration " << iteration << ", scale " << scale << ":";
  if (tensors.empty()) o << " no gradient named (this path does not attribute)";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const OverflowTensor& t = tensors[i];
    o << (i ? "; " : " ") << t.name << " held "
      << (t.inf && t.nan ? "inf and NaN"
          : t.inf        ? "inf"
                         : "NaN");
    if (!std::isnan(t.neighbours_max))
      o << " (its neighbours' largest finite |grad| " << t.neighbours_max << ")";
  }
  return o.str();
}

}  // namespace ampactor
