// The values the ranks agree on: found_inf, the gradients' size and which ranks found inf or NaN.
#include <ampactor/core/errors.h>
#include <ampactor/scaler/ranks.h>
#include <ampactor/scaler/step_tracker.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <string>

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

void check_reduce_scatter(const RankGroup& ranks, const at::Tensor& part,
                          const std::vector<std::int64_t>& bounds) {
  auto refuse = [](const std::string& what) {
    throw ScalerError(errc::protocol_misuse, "RankGroup::reduce_scatter: " + what);
  };
  if (!part.defined() || part.dim() != 1 || !part.is_contiguous())
    refuse("the part must be a contiguous 1-D tensor");
  if (bounds.size() != std::size_t(ranks.size()) + 1)
    refuse(std::to_string(bounds.size()) + " bounds for " + std::to_string(ranks.size()) +
           " ranks (one more than the ranks)");
  if (bounds.front() != 0 || bounds.back() != part.numel())
    refuse("the bounds must run from 0 to the part's " + std::to_string(part.numel()) +
           " elements");
  for (std::size_t r = 1; r < bounds.size(); ++r)
    if (bounds[r] < bounds[r - 1]) refuse("the bounds must not decrease");
}

void RankGroup::reduce_scatter(at::Tensor& part, const std::vector<std::int64_t>& bounds,
                               float* max_values, int n) {
  check_reduce_scatter(*this, part, bounds);
  std::vector<at::Tensor> whole{part};
  average(whole, max_values, n);
}

void check_shift(const RankGroup& ranks, const at::Tensor& mine, int by) {
  if (mine.scalar_type() != at::kByte || mine.dim() != 1 || !mine.is_contiguous() ||
      !mine.device().is_cpu())
    throw ScalerError(errc::protocol_misuse,
                      "RankGroup::shift: a contiguous 1-D kByte tensor on the CPU");
  if (by < 1 || by >= ranks.size())
    throw ScalerError(errc::protocol_misuse, "RankGroup::shift: by=" + std::to_string(by) +
                                                 " is not in [1, " + std::to_string(ranks.size()) +
                                                 ")");
}

void RankGroup::shift(const at::Tensor& mine, int by, at::Tensor& theirs) {
  check_shift(*this, mine, by);
  const int n = size(), from = (rank() - by + n) % n;
  // Every rank's length first, then every rank's bytes padded to the longest.
  at::Tensor len = at::empty({8}, at::kByte), lens = at::empty({8 * n}, at::kByte);
  const std::int64_t mine_len = mine.numel();
  std::memcpy(len.data_ptr(), &mine_len, 8);
  all_gather(len, lens);
  std::vector<std::int64_t> each(static_cast<std::size_t>(n));
  std::memcpy(each.data(), lens.data_ptr(), 8 * std::size_t(n));
  const std::int64_t most = std::max<std::int64_t>(1, *std::max_element(each.begin(), each.end()));
  at::Tensor padded = at::zeros({most}, at::kByte);
  padded.narrow(0, 0, mine_len).copy_(mine);
  at::Tensor all = at::empty({most * n}, at::kByte);
  all_gather(padded, all);
  theirs = all.narrow(0, most * from, each[std::size_t(from)]).clone();
}

void check_shift_pieces(const RankGroup& ranks, const at::Tensor& mine, int by,
                        std::int64_t piece) {
  check_shift(ranks, mine, by);
  if (piece < 1)
    throw ScalerError(errc::protocol_misuse,
                      "RankGroup::shift_pieces: piece=" + std::to_string(piece) + " is not >= 1");
}

void RankGroup::shift_pieces(const at::Tensor& mine, int by, std::int64_t piece,
                             const std::function<void(const char*, std::size_t)>& take) {
  check_shift_pieces(*this, mine, by, piece);
  at::Tensor theirs;
  shift(mine, by, theirs);
  const auto* data = static_cast<const char*>(theirs.data_ptr());
  for (std::int64_t off = 0; off < theirs.numel(); off += piece)
    take(data + off, std::size_t(std::min(piece, theirs.numel() - off)));
}

// The step tracker's side of the ranks' agreement: its record's values out, the agreed ones in.

Agreement StepTracker::local_values(const OptimizerRecord& rec, std::vector<float>& v) const {
  Agreement local{rec.any_found_inf(), rec.grad_size(), {}};
  if (ranks_) v = agreement_values(*ranks_, local.local_found_inf, local.size.max);
  return local;
}

void StepTracker::apply_agreed(OptimizerRecord& rec, const std::vector<float>& v,
                               Agreement local) const {
  for (auto& [device, t] : rec.found_inf_per_device)
    t.fill_(v[0]);
  local.size = {double(v[1]), local.size.dtype_max};
  local.found_by = ranks_that_found(v);
  rec.agreed = std::move(local);
}

void StepTracker::agree(OptimizerRecord& rec) const {
  if (!ranks_) return;
  std::vector<float> v;
  Agreement local = local_values(rec, v);
  // One collective per unscale on every rank, even one without gradients, so that the ranks'
  // calls stay paired.
  ranks_->all_max(v.data(), int(v.size()));
  apply_agreed(rec, v, std::move(local));
}

}  // namespace ampactor
