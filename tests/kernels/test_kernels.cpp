// The public kernel entry points against plain LibTorch references: every dtype, contiguous,
// transposed and sliced gradients, with and without inf/NaN; and every refusal.
#include "doctest_torch.h"

#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "refusal.h"
#include "tensor_helpers.h"

using namespace ampactor::test;
using ampactor::errc;
namespace k = ampactor::kernels;

namespace {

// Reference: unscale computed in float (double for fp64) and rounded back.
at::Tensor reference_unscale(const at::Tensor& g, float inv) {
  if (g.scalar_type() == at::kDouble) return g * double(inv);
  return (g.to(at::kFloat) * inv).to(g.scalar_type());
}

// Odd shapes: tails that are not multiples of any vector width, and one big enough to be split
// into chunks run on several threads.
std::vector<at::Tensor> make_list(at::ScalarType dtype, Layout l, Poison p, std::uint64_t seed) {
  const std::int64_t shapes[][2] = {{3, 5}, {1, 1}, {17, 9}, {129, 33}, {613, 541}, {2, 7}};
  std::vector<at::Tensor> out;
  for (auto& s : shapes)
    out.push_back(make_grad(s[0], s[1], dtype, l, seed++));
  // Poison the big one in the middle and the last one at its very end (a scalar tail).
  poison(out[4], p, 613 * 541 / 2 + 3);
  poison(out.back(), p, 13);
  return out;
}

}  // namespace

TEST_CASE("unscale_and_check equals the reference for every dtype, layout and poison") {
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts)
      for (Poison p : kPoisons)
        for (float inv : {1.0f / 65536.0f, 0.375f}) {
          CAPTURE(c10::toString(dtype));
          CAPTURE(name(l));
          CAPTURE(name(p));
          CAPTURE(inv);
          auto grads = make_list(dtype, l, p, 7);
          std::vector<at::Tensor> want;
          for (auto& g : grads)
            want.push_back(reference_unscale(g, inv));
          at::Tensor found = zero_flag();
          k::unscale_and_check(grads, inv, found);
          CHECK(found.item<float>() == (p == Poison::none ? 0.0f : 1.0f));
          CHECK(all_same(grads, want));
          // The layout of the gradients is kept (in place, not replaced).
          if (l == Layout::transposed) CHECK_FALSE(grads[3].is_contiguous());
        }
}

TEST_CASE("unscale_and_check takes inv_scale as a tensor too, and is the same on one thread") {
  const int threads = at::get_num_threads();
  for (int nthreads : {1, 2}) {
    at::set_num_threads(nthreads);
    auto grads = make_list(at::kFloat, Layout::contiguous, Poison::inf, 3);
    auto want = clones(grads);
    for (auto& w : want)
      w.mul_(0.125f);
    at::Tensor found = zero_flag();
    k::unscale_and_check(grads, at::full({1}, 0.125f, at::kFloat), found);
    CHECK(found.item<float>() == 1.0f);
    CHECK(all_same(grads, want));
  }
  at::set_num_threads(threads);
}

TEST_CASE("the threaded path (lists over the parallel threshold) equals the reference") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for_each_case([](at::ScalarType dtype, Layout l, Poison p) {
    // 3 x 333 x 1001 elements: many 64 Ki chunks; the poison sits in the very last chunk so
    // only the thread that owns it can see it.
    std::vector<at::Tensor> grads;
    for (int i = 0; i < 3; ++i)
      grads.push_back(make_grad(333, 1001, dtype, l, 40 + i));
    poison(grads.back(), p, 333 * 1001 - 2);
    std::vector<at::Tensor> want, master, want_master;
    for (auto& g : grads) {
      want.push_back(reference_unscale(g, 0.25f));
      want_master.push_back(dtype == at::kDouble ? (g * 0.25).to(at::kFloat)
                                                 : g.to(at::kFloat) * 0.25f);
      master.push_back(at::empty(g.sizes(), at::kFloat));
    }
    at::Tensor found_move = zero_flag(), found_check = zero_flag(), found = zero_flag();
    k::move_grads_and_unscale(grads, master, 0.25f, found_move);
    k::check_finite(grads, found_check);
    k::unscale_and_check(grads, 0.25f, found);
    const float expect = p == Poison::none ? 0.0f : 1.0f;
    CHECK(found.item<float>() == expect);
    CHECK(found_check.item<float>() == expect);
    CHECK(found_move.item<float>() == expect);
    CHECK(all_same(grads, want));
    CHECK(all_same(master, want_master));
  });
  at::set_num_threads(threads);
}

TEST_CASE("found_inf is only ever set, never cleared") {
  auto grads = make_list(at::kFloat, Layout::sliced, Poison::none, 11);
  at::Tensor found = at::ones({}, at::kFloat);
  k::unscale_and_check(grads, 0.5f, found);
  CHECK(found.item<float>() == 1.0f);
  k::check_finite(grads, found);
  CHECK(found.item<float>() == 1.0f);
}

TEST_CASE("check_finite and inv_scale == 1 find inf/NaN and leave every value as it is") {
  for_each_case([](at::ScalarType dtype, Layout l, Poison p) {
    auto grads = make_list(dtype, l, p, 5);
    auto before = clones(grads);
    at::Tensor found = zero_flag();
    k::check_finite(grads, found);
    CHECK(found.item<float>() == (p == Poison::none ? 0.0f : 1.0f));
    at::Tensor found1 = zero_flag();
    k::unscale_and_check(grads, 1.0f, found1);
    CHECK(found1.item<float>() == found.item<float>());
    CHECK(all_same(grads, before));
  });
}

TEST_CASE("check-only never writes: it runs on read-only memory") {
  const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 64 * page;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  float* data = static_cast<float*>(mem);
  const std::int64_t n = std::int64_t(bytes / sizeof(float));
  for (std::int64_t i = 0; i < n; ++i)
    data[i] = float(i % 97) - 48.0f;
  data[n - 5] = INFINITY;
  REQUIRE(mprotect(mem, bytes, PROT_READ) == 0);
  at::Tensor t = at::from_blob(data, {n}, at::kFloat);
  std::vector<at::Tensor> grads{t.slice(0, 0, n / 2), t.slice(0, n / 2, n), t.slice(0, 0, n, 3)};
  at::Tensor found = zero_flag();
  k::check_finite(grads, found);  // a write would be a SIGSEGV
  CHECK(found.item<float>() == 1.0f);
  at::Tensor found1 = zero_flag();
  k::unscale_and_check({grads[0]}, 1.0f, found1);
  CHECK(found1.item<float>() == 0.0f);
  munmap(mem, bytes);
}

TEST_CASE("move_grads_and_unscale equals copy_ then unscale, in one pass") {
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble})
    for (Layout l : kLayouts)
      for (Poison p : kPoisons)
        for (bool master_transposed : {false, true}) {
          CAPTURE(c10::toString(dtype));
          CAPTURE(name(l));
          CAPTURE(name(p));
          CAPTURE(master_transposed);
          const float inv = 1.0f / 1024.0f;
          auto model = make_list(dtype, l, p, 21);
          auto model_before = clones(model);
          std::vector<at::Tensor> master, want;
          for (auto& g : model) {
            at::Tensor m = master_transposed
                               ? at::full({g.size(1), g.size(0)}, -7.0f, at::kFloat).t()
                               : at::full(g.sizes(), -7.0f, at::kFloat);
            master.push_back(m);
            want.push_back(dtype == at::kDouble ? (g * double(inv)).to(at::kFloat)
                                                : g.to(at::kFloat) * inv);
          }
          at::Tensor found = zero_flag();
          k::move_grads_and_unscale(model, master, inv, found);
          CHECK(found.item<float>() == (p == Poison::none ? 0.0f : 1.0f));
          CHECK(all_same(master, want));
          CHECK(all_same(model, model_before));  // the source is only read
        }
}

TEST_CASE("move_grads_and_unscale takes inv_scale as a tensor") {
  auto model = make_list(at::kHalf, Layout::contiguous, Poison::none, 2);
  std::vector<at::Tensor> master;
  for (auto& g : model)
    master.push_back(at::empty(g.sizes(), at::kFloat));
  at::Tensor found = zero_flag();
  k::move_grads_and_unscale(model, master, at::full({}, 0.25f, at::kFloat), found);
  CHECK(found.item<float>() == 0.0f);
  for (std::size_t i = 0; i < model.size(); ++i)
    CHECK(at::equal(master[i], model[i].to(at::kFloat) * 0.25f));
}

TEST_CASE("an empty list is fine and finds nothing") {
  at::Tensor found = zero_flag();
  k::unscale_and_check({}, 0.5f, found);
  k::check_finite({}, found);
  k::move_grads_and_unscale({}, {}, 0.5f, found);
  CHECK(found.item<float>() == 0.0f);
  std::vector<at::Tensor> empty_tensor{at::empty({0, 3}, at::kFloat)};
  k::unscale_and_check(empty_tensor, 0.5f, found);
  CHECK(found.item<float>() == 0.0f);
}

TEST_CASE("bad input is refused as invalid_gradients with a clear error and no gradient changes") {
  // A good gradient first: it would be the first one written if checks were not all up front.
  auto good = [] { return make_grad(64, 64, at::kFloat, Layout::contiguous, 1); };
  struct Case {
    const char* what;
    std::vector<at::Tensor> grads;
    at::Tensor found;
    const char* message_part;
  };
  std::vector<Case> cases = {
      {"integer grads", {good(), at::ones({4}, at::kInt)}, zero_flag(), "has dtype Int"},
      {"mixed devices",
       {good(), at::empty({4}, at::TensorOptions().device(at::kMeta))},
       zero_flag(),
       "one device"},
      {"found_inf with 2 elements", {good()}, at::zeros({2}, at::kFloat), "exactly 1 element"},
      {"found_inf not float", {good()}, at::zeros({}, at::kDouble), "must be a Float tensor"},
      {"undefined found_inf", {good()}, at::Tensor(), "found_inf is undefined"},
      {"undefined grad", {good(), at::Tensor()}, zero_flag(), "grads[1] is undefined"},
      {"expanded grad",
       {good(), at::ones({1, 4}, at::kFloat).expand({3, 4})},
       zero_flag(),
       "overlapping memory"},
      {"sparse grad", {good(), at::ones({2, 2}).to_sparse()}, zero_flag(), "not a strided"},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    auto before = clones({c.grads[0]});
    at::Tensor found_before = c.found.defined() ? c.found.clone() : at::Tensor();
    const Refusal r = refusal_of([&] { k::unscale_and_check(c.grads, 0.5f, c.found); });
    CHECK(r.code == errc::invalid_gradients);
    CHECK(r.mentions(c.message_part));
    CHECK(r.what.rfind("ampactor::unscale_and_check: ", 0) == 0);
    CHECK(at::equal(c.grads[0], before[0]));
    if (c.found.defined()) CHECK(at::equal(c.found, found_before));
  }
  // Every tensor on a device this build has no kernels for.
  {
    auto meta = at::TensorOptions().device(at::kMeta);
    std::vector<at::Tensor> on_meta{at::empty({4}, meta.dtype(at::kFloat))};
    at::Tensor found_meta = at::empty({}, meta.dtype(at::kFloat));
    const Refusal r = refusal_of([&] { k::unscale_and_check(on_meta, 0.5f, found_meta); });
    CHECK(r.code == errc::invalid_gradients);
    CHECK(r.mentions("need the CUDA kernels"));
  }
  // inv_scale given as a bad tensor
  auto grads = std::vector<at::Tensor>{good()};
  auto before = clones(grads);
  at::Tensor found = zero_flag();
  const Refusal r = refusal_of([&] { k::unscale_and_check(grads, at::ones({3}), found); });
  CHECK(r.code == errc::invalid_gradients);
  CHECK(r.mentions("inv_scale must have exactly 1 element"));
  CHECK(at::equal(grads[0], before[0]));
}

TEST_CASE(
    "move_grads_and_unscale refuses mismatched or bad masters as invalid_gradients and changes "
    "nothing") {
  auto model = std::vector<at::Tensor>{make_grad(8, 8, at::kHalf, Layout::contiguous, 1),
                                       make_grad(4, 4, at::kHalf, Layout::contiguous, 2)};
  auto ok_master = at::full({8, 8}, 3.0f);
  struct Case {
    const char* what;
    std::vector<at::Tensor> master;
    const char* message_part;
  };
  std::vector<Case> cases = {
      {"shape mismatch", {ok_master, at::zeros({4, 5})}, "has shape [4, 5] but model_grads[1]"},
      {"count mismatch", {ok_master}, "got 2 model grads but 1 master grads"},
      {"half master", {ok_master, at::zeros({4, 4}, at::kHalf)}, "master grads must be Float"},
      {"expanded master", {ok_master, at::zeros({1, 4}).expand({4, 4})}, "overlapping memory"},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    at::Tensor found = zero_flag();
    const Refusal r = refusal_of([&] { k::move_grads_and_unscale(model, c.master, 0.5f, found); });
    CHECK(r.code == errc::invalid_gradients);
    CHECK(r.mentions(c.message_part));
    CHECK(at::equal(ok_master, at::full({8, 8}, 3.0f)));
    CHECK(found.item<float>() == 0.0f);
  }
}
