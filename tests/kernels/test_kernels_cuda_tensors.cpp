// The CUDA kernels through the tensor entry points (a LibTorch with CUDA; skipped without a
// device).
#include "kernels_cuda_fixture.h"

// ---- the tensor entry points on CUDA tensors (a LibTorch with CUDA) ----

#ifdef AMPACTOR_TORCH_CUDA
namespace {

/// The same view (sizes, strides, offset) on a CUDA copy of t's whole storage.
at::Tensor to_cuda_view(const at::Tensor& t) {
  return flat_storage(t).to(at::kCUDA).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

/// The CUDA view's whole storage back on the CPU, as the same view.
at::Tensor to_cpu_view(const at::Tensor& t) {
  const std::int64_t n = std::int64_t(t.storage().nbytes() / t.element_size());
  return t.as_strided({n}, {1}, 0).cpu().as_strided(t.sizes(), t.strides(), t.storage_offset());
}

}  // namespace

TEST_CASE("CUDA tensors: the entry points equal the CPU kernels, layouts kept, slices' gaps kept") {
  SKIP_WITHOUT_GPU();
  for_each_case([&](at::ScalarType dtype, Layout l, Poison p) {
    CAPTURE(c10::toString(dtype));
    CAPTURE(name(l));
    CAPTURE(name(p));
    auto cpu = make_list(dtype, l, p, 31);
    std::vector<at::Tensor> cuda, cuda_check;
    for (auto& g : cpu) {
      cuda.push_back(to_cuda_view(g));
      cuda_check.push_back(to_cuda_view(g));
    }
    // The inverse scale as a device tensor: read by the kernel, never by the host.
    at::Tensor inv = at::full({1}, 0.375f, at::TensorOptions().device(at::kCUDA));
    at::Tensor found = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
    at::Tensor found_check = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
    at::Tensor found_cpu = at::zeros({}, at::kFloat);
    k::unscale_and_check(cuda, inv, found);
    k::check_finite(cuda_check, found_check);
    k::unscale_and_check(cpu, 0.375f, found_cpu);
    CHECK(found.item<float>() == expected_flag(p));
    CHECK(found_check.item<float>() == expected_flag(p));
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      CHECK(cuda[i].strides() == cpu[i].strides());
      CHECK(same_values(flat_storage(to_cpu_view(cuda[i])), flat_storage(cpu[i])));
    }
  });
}

TEST_CASE("CUDA tensors: grad_absmax equals the CPU kernels' for every op, dtype and layout") {
  SKIP_WITHOUT_GPU();
  for_each_case([&](at::ScalarType dtype, Layout l, Poison p) {
    CAPTURE(c10::toString(dtype));
    CAPTURE(name(l));
    CAPTURE(name(p));
    auto cpu = make_list(dtype, l, p, 37);
    std::vector<at::Tensor> cuda, cuda_check, cuda_src, masters, cpu_masters;
    for (auto& g : cpu) {
      cuda.push_back(to_cuda_view(g));
      cuda_check.push_back(to_cuda_view(g));
      cuda_src.push_back(to_cuda_view(g));
      masters.push_back(at::empty(g.sizes(), at::TensorOptions().device(at::kCUDA)));
      cpu_masters.push_back(at::empty(g.sizes(), at::kFloat));
    }
    const auto dev = at::TensorOptions().device(at::kCUDA);
    at::Tensor found = at::zeros({1}, dev), m1 = at::zeros({1}, dev), m2 = at::zeros({1}, dev),
               m3 = at::zeros({1}, dev);
    at::Tensor found_cpu = at::zeros({}), m_cpu = at::zeros({}), m_move_cpu = at::zeros({});
    k::move_grads_and_unscale(cpu, cpu_masters, 0.5f, found_cpu, m_move_cpu);
    k::unscale_and_check(cpu, 0.375f, found_cpu, m_cpu);
    k::unscale_and_check(cuda, at::full({1}, 0.375f, dev), found, m1);
    k::check_finite(cuda_check, found, m2);
    k::move_grads_and_unscale(cuda_src, masters, 0.5f, found, m3);
    CHECK(m_cpu.item<float>() == m_move_cpu.item<float>());
    CHECK(m1.item<float>() == m_cpu.item<float>());
    CHECK(m2.item<float>() == m_cpu.item<float>());
    CHECK(m3.item<float>() == m_cpu.item<float>());
  });
}

TEST_CASE("CUDA tensors: move_grads_and_unscale into contiguous, transposed and sliced masters") {
  SKIP_WITHOUT_GPU();
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts)
      for (Layout master_layout : kLayouts)
        for (Poison p : {Poison::none, Poison::nan}) {
          CAPTURE(c10::toString(dtype));
          CAPTURE(name(l));
          CAPTURE(name(master_layout));
          CAPTURE(name(p));
          auto model = make_list(dtype, l, p, 41);
          std::vector<at::Tensor> model_cuda, master_cpu, master_cuda;
          for (auto& g : model) {
            model_cuda.push_back(to_cuda_view(g));
            master_cpu.push_back(
                make_grad(g.size(0), g.size(1), at::kFloat, master_layout, 3).fill_(-7.0f));
            master_cuda.push_back(to_cuda_view(master_cpu.back()));
          }
          at::Tensor found = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
          at::Tensor found_cpu = at::zeros({}, at::kFloat);
          k::move_grads_and_unscale(model_cuda, master_cuda, 1.0f / 1024.0f, found);
          k::move_grads_and_unscale(model, master_cpu, 1.0f / 1024.0f, found_cpu);
          CHECK(found.item<float>() == expected_flag(p));
          for (std::size_t i = 0; i < model.size(); ++i) {
            CHECK(same_values(flat_storage(to_cpu_view(master_cuda[i])),
                              flat_storage(master_cpu[i])));
            CHECK(same_values(to_cpu_view(model_cuda[i]), model[i]));  // the source is only read
          }
        }
}

TEST_CASE("CUDA tensors: the same results as torch's _amp_foreach_non_finite_check_and_unscale_") {
  SKIP_WITHOUT_GPU();
  for (at::ScalarType dtype : {at::kFloat, at::kHalf})  // torch's kernel has no bf16
    for (Poison p : kPoisons) {
      CAPTURE(c10::toString(dtype));
      CAPTURE(name(p));
      auto cpu = make_list(dtype, Layout::contiguous, p, 51);
      std::vector<at::Tensor> ours, theirs;
      for (auto& g : cpu) {
        ours.push_back(g.to(at::kCUDA));
        theirs.push_back(g.to(at::kCUDA));
      }
      auto opts = at::TensorOptions().device(at::kCUDA);
      at::Tensor inv = at::full({1}, 1.0f / 4096.0f, opts);
      at::Tensor found = at::zeros({1}, opts), found_torch = at::zeros({1}, opts);
      k::unscale_and_check(ours, inv, found);
      at::_amp_foreach_non_finite_check_and_unscale_(theirs, found_torch, inv);
      CHECK(found.item<float>() == found_torch.item<float>());
      for (std::size_t i = 0; i < cpu.size(); ++i)
        CHECK(same_values(ours[i].cpu(), theirs[i].cpu()));
    }
}

TEST_CASE("CUDA tensors: update_scale on the device equals the CPU tensors' update") {
  SKIP_WITHOUT_GPU();
  auto opts = at::TensorOptions().device(at::kCUDA);
  at::Tensor scale = at::full({1}, 65536.0f, opts), tracker = at::zeros({1}, opts.dtype(at::kInt));
  at::Tensor scale_cpu = scale.cpu(), tracker_cpu = tracker.cpu();
  for (int step = 0; step < 50; ++step) {
    const float f = step % 7 == 3 ? 1.0f : 0.0f;
    at::Tensor found = at::full({1}, f, opts), found_cpu = at::full({1}, f);
    k::update_scale(scale, tracker, found, 2.0, 0.5, 4);
    k::update_scale(scale_cpu, tracker_cpu, found_cpu, 2.0, 0.5, 4);
  }
  CHECK(scale.item<float>() == scale_cpu.item<float>());
  CHECK(tracker.item<std::int32_t>() == tracker_cpu.item<std::int32_t>());
}

TEST_CASE("CUDA tensors: mixed devices are refused as invalid_gradients before anything runs") {
  SKIP_WITHOUT_GPU();
  std::vector<at::Tensor> grads{at::ones({4}, at::TensorOptions().device(at::kCUDA)),
                                at::ones({4})};
  at::Tensor found = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
  const Refusal on_cuda = refusal_of([&] { k::unscale_and_check(grads, 0.5f, found); });
  CHECK(on_cuda.code == ampactor::errc::invalid_gradients);
  CHECK(on_cuda.mentions("one device"));
  CHECK(grads[0].cpu().equal(at::ones({4})));
  at::Tensor found_cpu = at::zeros({1});
  const Refusal on_cpu = refusal_of([&] { k::unscale_and_check({grads[0]}, 0.5f, found_cpu); });
  CHECK(on_cpu.code == ampactor::errc::invalid_gradients);
  CHECK(on_cpu.mentions("one device"));
}

#elif defined(AMPACTOR_CUDA_BUILT)

TEST_CASE("CUDA tensors: the tensor entry points need a LibTorch with CUDA") {
  AMPACTOR_SKIP_NO_GPU(
      "this LibTorch has no CUDA, so no CUDA tensor can reach the entry points "
      "(the raw launcher tests above cover the kernels)");
}

#endif  // AMPACTOR_TORCH_CUDA
