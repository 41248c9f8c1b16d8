// The checks of check_collectives (dist_collectives.h), run by every rank of one launch.
#include "dist_collectives.h"

#include <ampactor/core/errors.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ampactor::test {

namespace {

/// Rank r's element e: rank 0 holds numbers near 1, the others multiples of 2^-24, so that
/// adding them to 1 one at a time (rank order) rounds them away where adding them first does not.
at::Tensor values_of(int r, std::int64_t n, at::ScalarType dtype) {
  at::Tensor e = at::arange(n, at::kDouble);
  at::Tensor v = r == 0 ? e.remainder(7).mul(std::ldexp(1.0, -10)).add(1.0)
                        : e.add(r).remainder(3).add(1.0).mul(std::ldexp(1.0, -24));
  return v.to(dtype);
}

/// The ranks' mean of values_of, summed in rank order (or the reverse), then divided by size.
at::Tensor mean_of(int size, std::int64_t n, at::ScalarType dtype, bool reverse = false) {
  at::Tensor s = values_of(reverse ? size - 1 : 0, n, dtype);
  for (int k = 1; k < size; ++k)
    s.add_(values_of(reverse ? size - 1 - k : k, n, dtype));
  return s.div_(double(size));
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         a.contiguous().view(at::kByte).equal(b.contiguous().view(at::kByte));
}

std::vector<float> maxima_of(int rank) {
  return {float(rank), -float(rank), 0.25f * float(rank) + 1};
}

std::string maxima_wrong(const std::vector<float>& got, int size) {
  const std::vector<float> want = {float(size - 1), 0.0f, 0.25f * float(size - 1) + 1};
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      return "maximum " + std::to_string(i) + " is " + std::to_string(got[i]) + ", not " +
             std::to_string(want[i]);
  return "";
}

void say(std::ostream& out, const std::string& check, const std::string& wrong) {
  out << check << (wrong.empty() ? " ok" : " FAILED: " + wrong) << "\n";
}

}  // namespace

void check_collectives(RankGroup& ranks, std::ostream& out) {
  const int rank = ranks.rank(), size = ranks.size();
  out << "order matters "
      << (same_bits(mean_of(size, 1000, at::kFloat), mean_of(size, 1000, at::kFloat, true)) ? "no"
                                                                                            : "yes")
      << "\n";

  // average: fp32 tensors of several shapes in one bucket (the maxima ride on it), and an fp64
  // tensor of one element, a bucket of its own whose cuts are empty but one.
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {1000}, {3, 5}, {1}};
  std::vector<at::Tensor> tensors;
  for (const auto& shape : shapes) {
    std::int64_t n = 1;
    for (auto d : shape)
      n *= d;
    tensors.push_back(values_of(rank, n, at::kFloat).view(shape));
  }
  tensors.push_back(values_of(rank, 1, at::kDouble));
  std::vector<float> maxima = maxima_of(rank);
  ranks.average(tensors, maxima.data(), int(maxima.size()));
  std::string wrong = maxima_wrong(maxima, size);
  for (std::size_t i = 0; i < tensors.size() && wrong.empty(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!same_bits(t.reshape({-1}), mean_of(size, t.numel(), t.scalar_type())))
      wrong = "tensor " + std::to_string(i) + " is not the mean in rank order";
  }
  say(out, "average", wrong);

  // reduce_scatter: uneven cuts, rank 0's empty.
  const std::int64_t n = 1001;
  std::vector<std::int64_t> bounds = {0, 0};
  for (int r = 1; r < size; ++r)
    bounds.push_back(r == size - 1 ? n : bounds.back() + 1 + 97 * r);
  at::Tensor part = values_of(rank, n, at::kFloat);
  maxima = maxima_of(rank);
  ranks.reduce_scatter(part, bounds, maxima.data(), int(maxima.size()));
  wrong = maxima_wrong(maxima, size);
  const std::int64_t lo = bounds[std::size_t(rank)], len = bounds[std::size_t(rank) + 1] - lo;
  if (wrong.empty() &&
      !same_bits(part.narrow(0, lo, len), mean_of(size, n, at::kFloat).narrow(0, lo, len)))
    wrong = "this rank's cut is not the mean in rank order";
  say(out, "reduce_scatter", wrong);

  // An empty part: the maxima are agreed all the same.
  at::Tensor none = at::empty({0}, at::kFloat);
  maxima = maxima_of(rank);
  ranks.reduce_scatter(none, std::vector<std::int64_t>(std::size_t(size) + 1, 0), maxima.data(),
                       int(maxima.size()));
  say(out, "empty", maxima_wrong(maxima, size));

  // Bad bounds: refused on each rank before any collective, the part untouched.
  at::Tensor kept = part.clone();
  wrong = "not refused";
  try {
    ranks.reduce_scatter(part, std::vector<std::int64_t>(std::size_t(size), 0));
  } catch (const ScalerError& e) {
    wrong = e.code() != errc::protocol_misuse
                ? "refused with another code: " + std::string(e.what())
            : !same_bits(part, kept) ? "the part changed"
                                     : "";
    if (wrong.empty() && std::string(e.what()).find("bounds for") == std::string::npos)
      wrong = "refused with " + std::string(e.what());
  }
  say(out, "refused", wrong);

  // shift: rank r's bytes (r x 3 + 1 of them, rank 0's none) to each rank `by` on, by the
  // group's own sends and by RankGroup's default (all-gathered); every shift of the ring.
  const auto bytes_of = [](int r) {
    const std::int64_t n = r == 0 ? 0 : r * 3 + 1;
    return at::arange(n, at::kLong).add(r * 7).remainder(256).to(at::kByte);
  };
  wrong.clear();
  for (int by = 1; by < size && wrong.empty(); ++by) {
    const int from = (rank - by + size) % size;
    at::Tensor got, got_default;
    ranks.shift(bytes_of(rank), by, got);
    ranks.RankGroup::shift(bytes_of(rank), by, got_default);
    if (!same_bits(got, bytes_of(from)) || !same_bits(got_default, bytes_of(from)))
      wrong = "by " + std::to_string(by) + ": not rank " + std::to_string(from) + "'s bytes";
  }
  for (const int by : {0, size})
    try {
      at::Tensor got;
      ranks.shift(bytes_of(rank), by, got);
      wrong = "by " + std::to_string(by) + " not refused";
    } catch (const ScalerError& e) {
      if (e.code() != errc::protocol_misuse) wrong = e.what();
    }
  say(out, "shift", wrong);

  // shift_pieces: the same bytes, whole and in order, in pieces of 1, 2, 5 and more than any
  // rank holds, by the group's receive into two buffers and by the default; a take that throws
  // at its second piece hears of nothing more, its exception comes back after the exchange, and
  // the ranks are still in step (the next exchange is right).
  wrong.clear();
  for (const std::int64_t piece : {1, 2, 5, 1000})
    for (int by = 1; by < size && wrong.empty(); ++by)
      for (const bool by_default : {false, true}) {
        const int from = (rank - by + size) % size;
        std::string got;
        std::int64_t pieces = 0, largest = 0;
        const auto take = [&](const char* p, std::size_t n) {
          got.append(p, n);
          ++pieces;
          largest = std::max<std::int64_t>(largest, std::int64_t(n));
        };
        if (by_default)
          ranks.RankGroup::shift_pieces(bytes_of(rank), by, piece, take);
        else
          ranks.shift_pieces(bytes_of(rank), by, piece, take);
        const at::Tensor want = bytes_of(from);
        const std::int64_t n = want.numel();
        if (got != std::string(static_cast<const char*>(want.data_ptr()), std::size_t(n)) ||
            pieces != (n + piece - 1) / piece || largest > piece)
          wrong = "piece " + std::to_string(piece) + " by " + std::to_string(by) +
                  (by_default ? " (default)" : "") + ": not rank " + std::to_string(from) +
                  "'s bytes in pieces";
      }
  for (const bool by_default : {false, true}) {
    int calls = 0;
    const auto throwing = [&](const char*, std::size_t) {
      if (++calls == 2) throw std::runtime_error("the disk is full");
    };
    try {
      // Every rank's bytes padded to 10, so that each hands out at least 2 pieces of 4.
      const at::Tensor mine = at::cat({bytes_of(rank), at::zeros({10}, at::kByte)});
      if (by_default)
        ranks.RankGroup::shift_pieces(mine, 1, 4, throwing);
      else
        ranks.shift_pieces(mine, 1, 4, throwing);
      wrong = "a take that threw: nothing rethrown";
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()) != "the disk is full" || calls != 2)
        wrong = "a take that threw: " + std::string(e.what()) + " after " + std::to_string(calls) +
                " pieces";
    }
    at::Tensor after;
    ranks.shift(bytes_of(rank), 1, after);
    if (!same_bits(after, bytes_of((rank - 1 + size) % size)))
      wrong = "after a take that threw: the next shift is not right";
  }
  try {
    ranks.shift_pieces(bytes_of(rank), 1, 0, [](const char*, std::size_t) {});
    wrong = "piece 0 not refused";
  } catch (const ScalerError& e) {
    if (e.code() != errc::protocol_misuse) wrong = e.what();
  }
  say(out, "shift_pieces", wrong);
}

}  // namespace ampactor::test
