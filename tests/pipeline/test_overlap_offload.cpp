// The overlapped-backward mode with the model on the GPU and the masters on the CPU
// (master_device kCPU): each bucket's grads leave the GPU as backward finishes it and are stepped
// speculatively on the CPU; held to the offload run at staleness 0 without overlap, bit for bit.
// Every case needs a CUDA device and a LibTorch with CUDA; without them each is reported skipped.
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "overlap_fixture.h"
#include "torch_cuda_skip.h"

using namespace ampactor;
using namespace ampactor::test::overlap;

namespace {

Setup on_gpu(Setup s) {
  s.gpu = true;
  return s;
}

}  // namespace

TEST_CASE("offload, overlap_backward: the same training as offload at staleness 0, bit for bit") {
  SKIP_WITHOUT_GPU();
  for (const test::OptConfig& c : {test::configs()[0], test::configs()[3], test::configs()[5]})
    for (at::ScalarType dtype : {at::kHalf, at::kBFloat16})
      same_training(on_gpu(setup(c, dtype)));
}

TEST_CASE("offload, overlap_backward: bit for bit with 3 micro-batches, explicit readiness") {
  SKIP_WITHOUT_GPU();
  const test::OptConfig adamw = test::configs()[3];
  same_training(on_gpu(setup(adamw, at::kHalf, 3)));
  same_training(on_gpu(setup(adamw, at::kHalf, 1, /*hooks=*/false)));
  same_training(on_gpu(
      setup(test::configs().back(), at::kBFloat16, 3, true, {{9}, {8, 7, 6, 5, 4, 3, 2, 1, 0}})));
}

TEST_CASE("offload, overlap_backward: clipped as the offload run clips, bit for bit") {
  SKIP_WITHOUT_GPU();
  const Setup s = clip_at_median(on_gpu(setup(test::configs()[0], at::kHalf)));
  same_training(s);
  const Trained ref = train(s, false), ov = train(s, true);
  for (std::size_t k = 0; k < ref.norms.size(); ++k)
    if (!ref.skipped[k]) CHECK(ov.norms[k] == ref.norms[k]);
}

TEST_CASE(
    "offload, overlap_backward: the second buffers, the masters' and Adam's state once more") {
  SKIP_WITHOUT_GPU();
  const Trained t = train(on_gpu(setup(test::configs()[0], at::kHalf)), true);
  Model m(at::kHalf);
  std::int64_t params = 0;
  for (const at::Tensor& p : m.p)
    params += p.numel();
  CHECK(t.extra_bytes == params * (12 + 2));  // and the fp16 weights staged on the GPU
}

TEST_CASE("offload, overlap_backward: the masters on the GPU are refused, naming why") {
  SKIP_WITHOUT_GPU();
  Model m(at::kHalf, at::Device(at::kCUDA));
  GradScaler scaler(test::opts(1024, 2, 0.5, 2).allow_fp16_grads(true));
  try {
    AsyncOptimizer pipe(m.p, scaler, AsyncOptimizerOptions().staleness(0).overlap_backward(true));
    FAIL("the masters on the GPU were accepted");
  } catch (const ScalerError& e) {
    CHECK(e.code() == errc::bad_option);
    CHECK(std::string(e.what()).find("master_device(kCPU)") != std::string::npos);
  }
}
