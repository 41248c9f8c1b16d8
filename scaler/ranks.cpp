// The values the ranks agree on: found_inf, the gradients' size and which ranks found inf or NaN.
#include <ampactor/scaler/ranks.h>

namespace ampactor {

std::vector<float> agreement_values(const RankGroup& ranks, bool local_found_inf, double grad_max) {
  std::vector<float> v(2 + std::size_t(ranks.size()), 0.0f);
  v[0] = local_found_inf ? 1.0f : 0.0f;
  v[1] = float(grad_max);
  v[2 + std::size_t(ranks.rank())] = v[0];
  return v;
}

std::vector<std::int32_t> ranks_that_found(const std::vector<float>& agreed) {
  std::vector<std::int32_t> out;
  for (std::size_t r = 2; r < agreed.size(); ++r)
    if (agreed[r] != 0) out.push_back(std::int32_t(r - 2));
  return out;
}

}  // namespace ampactor
