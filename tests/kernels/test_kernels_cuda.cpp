// The CUDA kernels through their raw launchers, against the CPU kernels (skipped without a device).
#include "kernels_cuda_fixture.h"

#ifndef AMPACTOR_CUDA_BUILT
TEST_CASE("CUDA kernels are not in a build without CUDA") {
  SKIP_WITHOUT_GPU();
}
#endif

#ifdef AMPACTOR_CUDA_BUILT
namespace {

namespace gpu = ampactor::kernels::gpu;

gpu::DType gpu_type(at::ScalarType t) {
  return t == at::kDouble     ? gpu::DType::f64
         : t == at::kHalf     ? gpu::DType::f16
         : t == at::kBFloat16 ? gpu::DType::bf16
                              : gpu::DType::f32;
}

/// Device memory, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { REQUIRE(cudaMalloc(&ptr, n ? n : 1) == 0); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* at(std::size_t offset) const { return static_cast<char*>(ptr) + offset; }
  void upload(const void* src) {
    REQUIRE(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice) == 0);
  }
  void download(void* dst) const {
    REQUIRE(cudaMemcpy(dst, ptr, bytes, cudaMemcpyDeviceToHost) == 0);
  }
};

/// A CPU tensor's whole storage mirrored on the device, and the view as spans of device memory:
/// one span when the view is dense (in memory order), one per row when it is a 2-D slice.
struct DeviceView {
  at::Tensor host;
  DeviceBuffer buf;
  explicit DeviceView(const at::Tensor& t) : host(t), buf(t.storage().nbytes()) {
    buf.upload(t.storage().data());
  }
  char* dev_data() const {
    return buf.at(static_cast<const char*>(host.data_ptr()) -
                  static_cast<const char*>(host.storage().data()));
  }
  std::vector<gpu::Span> spans() const {
    const gpu::DType type = gpu_type(host.scalar_type());
    if (host.is_non_overlapping_and_dense()) return {{dev_data(), host.numel(), type}};
    REQUIRE(host.dim() == 2);
    REQUIRE(host.stride(1) == 1);
    std::vector<gpu::Span> rows;
    for (std::int64_t r = 0; r < host.size(0); ++r)
      rows.push_back({dev_data() + r * host.stride(0) * host.element_size(), host.size(1), type});
    return rows;
  }
  /// Copies the device storage back into the host tensor's storage. Its base address comes from
  /// data_ptr(): LibTorch 2.x's Storage::data() is const (mutable_data() did not exist in 1.13).
  void download() {
    buf.download(static_cast<char*>(host.data_ptr()) - host.storage_offset() * host.element_size());
  }
};

float read_flag(const DeviceBuffer& flag) {
  float v = -1;
  flag.download(&v);
  return v;
}

void require_ok(int status) {
  CAPTURE(gpu::error_string(status));
  REQUIRE(status == 0);
}

}  // namespace

TEST_CASE("CUDA unscale_and_check equals the CPU kernels on every dtype, layout and poison") {
  SKIP_WITHOUT_GPU();
  DeviceBuffer inv_dev(sizeof(float));
  for (at::ScalarType dtype : kGradTypes)
    for (Layout l : kLayouts)
      for (Poison p : kPoisons)
        for (float inv : {1.0f / 65536.0f, 0.375f, 1.0f}) {
          for (bool inv_on_device : {false, true}) {
            CAPTURE(c10::toString(dtype));
            CAPTURE(name(l));
            CAPTURE(name(p));
            CAPTURE(inv);
            CAPTURE(inv_on_device);
            auto grads = make_list(dtype, l, p, 7);
            std::vector<at::Tensor> want;
            std::vector<std::unique_ptr<DeviceView>> views;
            std::vector<gpu::Span> spans;
            for (auto& g : grads) {
              want.push_back(deep_copy(g));
              views.push_back(std::make_unique<DeviceView>(g));
              for (const gpu::Span& s : views.back()->spans())
                spans.push_back(s);
            }
            at::Tensor found_cpu = at::zeros({}, at::kFloat);
            k::unscale_and_check(want, inv, found_cpu);
            DeviceBuffer flag(sizeof(float));
            const float zero = 0.0f;
            flag.upload(&zero);
            inv_dev.upload(&inv);
            require_ok(gpu::unscale_and_check(
                spans.data(), spans.size(),
                inv_on_device ? static_cast<float*>(inv_dev.ptr) : nullptr,
                inv_on_device ? -5.0f : inv, static_cast<float*>(flag.ptr), nullptr));
            REQUIRE(cudaDeviceSynchronize() == 0);
            CHECK(read_flag(flag) == expected_flag(p));
            CHECK(found_cpu.item<float>() == expected_flag(p));
            for (std::size_t i = 0; i < grads.size(); ++i) {
              views[i]->download();
              // The whole storage: the view's values, and the gaps of a slice left alone.
              CHECK(same_values(flat_storage(grads[i]), flat_storage(want[i])));
            }
          }
        }
}

TEST_CASE("CUDA check_finite finds inf and NaN and writes nothing") {
  SKIP_WITHOUT_GPU();
  for_each_case([&](at::ScalarType dtype, Layout l, Poison p) {
    CAPTURE(c10::toString(dtype));
    CAPTURE(name(l));
    CAPTURE(name(p));
    auto grads = make_list(dtype, l, p, 9);
    std::vector<at::Tensor> before;
    std::vector<std::unique_ptr<DeviceView>> views;
    std::vector<gpu::Span> spans;
    for (auto& g : grads) {
      before.push_back(flat_storage(g).clone());
      views.push_back(std::make_unique<DeviceView>(g));
      for (const gpu::Span& s : views.back()->spans())
        spans.push_back(s);
    }
    at::Tensor found_cpu = at::zeros({}, at::kFloat);
    k::check_finite(grads, found_cpu);
    DeviceBuffer flag(sizeof(float));
    const float zero = 0.0f;
    flag.upload(&zero);
    require_ok(
        gpu::check_finite(spans.data(), spans.size(), static_cast<float*>(flag.ptr), nullptr));
    REQUIRE(cudaDeviceSynchronize() == 0);
    CHECK(read_flag(flag) == found_cpu.item<float>());
    CHECK(read_flag(flag) == expected_flag(p));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      views[i]->download();
      const at::Tensor now = flat_storage(grads[i]);
      CHECK(std::memcmp(now.data_ptr(), before[i].data_ptr(), now.nbytes()) == 0);
    }
  });
}

TEST_CASE("CUDA grad_absmax of check_finite and unscale_and_check equals the CPU kernels'") {
  SKIP_WITHOUT_GPU();
  for_each_case([&](at::ScalarType dtype, Layout l, Poison p) {
    CAPTURE(c10::toString(dtype));
    CAPTURE(name(l));
    CAPTURE(name(p));
    auto grads = make_list(dtype, l, p, 13);
    std::vector<std::unique_ptr<DeviceView>> views;
    std::vector<gpu::Span> spans;
    for (auto& g : grads) {
      views.push_back(std::make_unique<DeviceView>(g));
      for (const gpu::Span& s : views.back()->spans())
        spans.push_back(s);
    }
    at::Tensor found_cpu = at::zeros({}, at::kFloat), max_cpu = at::zeros({}, at::kFloat);
    k::check_finite(grads, found_cpu, max_cpu);
    DeviceBuffer flag(sizeof(float)), max_check(sizeof(float)), max_unscale(sizeof(float));
    const float zero = 0.0f;
    flag.upload(&zero);
    max_check.upload(&zero);
    max_unscale.upload(&zero);
    require_ok(gpu::check_finite(spans.data(), spans.size(), static_cast<float*>(flag.ptr), nullptr,
                                 static_cast<float*>(max_check.ptr)));
    require_ok(gpu::unscale_and_check(spans.data(), spans.size(), nullptr, 0.25f,
                                      static_cast<float*>(flag.ptr), nullptr,
                                      static_cast<float*>(max_unscale.ptr)));
    REQUIRE(cudaDeviceSynchronize() == 0);
    CHECK(read_flag(max_check) == max_cpu.item<float>());
    CHECK(read_flag(max_unscale) == max_cpu.item<float>());  // measured before the multiply
    CHECK(read_flag(flag) == expected_flag(p));
  });
}

TEST_CASE("CUDA move_grads_and_unscale equals the CPU kernels on every dtype, layout and poison") {
  SKIP_WITHOUT_GPU();
  for_each_case([&](at::ScalarType dtype, Layout l, Poison p) {
    CAPTURE(c10::toString(dtype));
    CAPTURE(name(l));
    CAPTURE(name(p));
    const float inv = 1.0f / 1024.0f;
    auto model = make_list(dtype, l, p, 21);
    std::vector<at::Tensor> master;
    std::vector<std::unique_ptr<DeviceView>> views;
    std::vector<std::unique_ptr<DeviceBuffer>> dst;
    std::vector<gpu::MoveSpan> spans;
    for (auto& g : model) {
      // Masters in the model's memory order where it is dense, row-major for slices.
      const bool dense = g.is_non_overlapping_and_dense();
      master.push_back(dense ? at::empty_strided(g.sizes(), g.strides(), at::kFloat)
                             : at::empty(g.sizes(), at::kFloat));
      views.push_back(std::make_unique<DeviceView>(g));
      dst.push_back(std::make_unique<DeviceBuffer>(std::size_t(g.numel()) * 4));
      float* d = static_cast<float*>(dst.back()->ptr);
      for (const gpu::Span& s : views.back()->spans()) {
        spans.push_back({s.data, d, s.numel, s.dtype});
        d += s.numel;
      }
    }
    at::Tensor found_cpu = at::zeros({}, at::kFloat);
    k::move_grads_and_unscale(model, master, inv, found_cpu);
    DeviceBuffer flag(sizeof(float));
    const float zero = 0.0f;
    flag.upload(&zero);
    require_ok(gpu::move_grads_and_unscale(spans.data(), spans.size(), nullptr, inv,
                                           static_cast<float*>(flag.ptr), nullptr));
    REQUIRE(cudaDeviceSynchronize() == 0);
    CHECK(read_flag(flag) == expected_flag(p));
    for (std::size_t i = 0; i < model.size(); ++i) {
      at::Tensor got = at::empty({model[i].numel()}, at::kFloat);
      dst[i]->download(got.data_ptr());
      CHECK(same_values(got, flat_storage(master[i])));
    }
  });
}

TEST_CASE("CUDA lists of 1 to 2100 tensors of odd sizes, mixed dtypes and unaligned starts") {
  SKIP_WITHOUT_GPU();
  const std::size_t per_launch = gpu::max_spans_per_launch();
  CHECK(per_launch >= 1000);  // a list of a thousand small tensors is one launch
  for (int count : {1, 31, 32, 33, 1000, 1024, 1025, 2100}) {
    for (Poison p : kPoisons) {
      CAPTURE(count);
      CAPTURE(name(p));
      // Each tensor a 1-D run packed into one buffer; every third starts one element past a
      // 16-byte boundary, so both the vector and the scalar paths run.
      std::vector<at::Tensor> cpu;
      std::vector<std::size_t> offsets;
      std::size_t bytes = 0;
      for (int i = 0; i < count; ++i) {
        const at::ScalarType dtype = kGradTypes[i % 4];
        const std::int64_t n = (std::int64_t(i) * 7919) % 3001 + 1 + (i == count / 2) * 70001;
        at::manual_seed(std::uint64_t(i));
        cpu.push_back((at::randn({n}) * 8).to(dtype));
        bytes = (bytes + 255) / 256 * 256 + (i % 3 == 2 ? cpu.back().element_size() : 0);
        offsets.push_back(bytes);
        bytes += std::size_t(n) * cpu.back().element_size();
      }
      // The poison sits in the last tensor of the last launch, at its end (a scalar tail).
      if (p != Poison::none)
        cpu.back()
            .view({-1})
            .select(0, cpu.back().numel() - 1)
            .fill_(p == Poison::inf ? INFINITY : NAN);
      std::vector<char> staging(bytes);
      std::vector<gpu::Span> spans;
      DeviceBuffer buf(bytes);
      for (int i = 0; i < count; ++i) {
        std::memcpy(staging.data() + offsets[i], cpu[i].data_ptr(), cpu[i].nbytes());
        spans.push_back({buf.at(offsets[i]), cpu[i].numel(), gpu_type(cpu[i].scalar_type())});
      }
      buf.upload(staging.data());
      std::vector<at::Tensor> want;
      for (auto& t : cpu)
        want.push_back(t.clone());
      at::Tensor found_cpu = at::zeros({}, at::kFloat);
      k::unscale_and_check(want, 0.25f, found_cpu);
      DeviceBuffer flag(sizeof(float)), check_flag(sizeof(float));
      const float zero = 0.0f;
      flag.upload(&zero);
      check_flag.upload(&zero);
      require_ok(gpu::check_finite(spans.data(), spans.size(), static_cast<float*>(check_flag.ptr),
                                   nullptr));
      require_ok(gpu::unscale_and_check(spans.data(), spans.size(), nullptr, 0.25f,
                                        static_cast<float*>(flag.ptr), nullptr));
      REQUIRE(cudaDeviceSynchronize() == 0);
      CHECK(read_flag(flag) == expected_flag(p));
      CHECK(read_flag(check_flag) == expected_flag(p));
      buf.download(staging.data());
      bool all_equal = true;
      for (int i = 0; i < count; ++i) {
        at::Tensor got = at::empty_like(cpu[i]);
        std::memcpy(got.data_ptr(), staging.data() + offsets[i], got.nbytes());
        all_equal = all_equal && same_values(got, want[i]);
      }
      CHECK(all_equal);
    }
  }
}

TEST_CASE("CUDA launchers refuse bad input before queuing anything") {
  SKIP_WITHOUT_GPU();
  DeviceBuffer data(64), flag(4);
  const float zero = 0.0f, pattern = 3.0f;
  flag.upload(&zero);
  std::vector<float> ones(16, pattern);
  data.upload(ones.data());
  // A good span first: it would be the first one processed if checks were not all up front.
  const gpu::Span good{data.ptr, 16, gpu::DType::f32};
  const gpu::Span bad_cases[] = {{nullptr, 4, gpu::DType::f32},
                                 {data.ptr, -1, gpu::DType::f32},
                                 {data.ptr, 4, static_cast<gpu::DType>(9)}};
  for (const gpu::Span& bad : bad_cases) {
    const gpu::Span list[] = {good, bad};
    CHECK(gpu::unscale_and_check(list, 2, nullptr, 0.5f, static_cast<float*>(flag.ptr), nullptr) ==
          gpu::kInvalidInput);
    CHECK(gpu::check_finite(list, 2, static_cast<float*>(flag.ptr), nullptr) == gpu::kInvalidInput);
  }
  CHECK(gpu::unscale_and_check(&good, 1, nullptr, 0.5f, nullptr, nullptr) == gpu::kInvalidInput);
  const gpu::MoveSpan move_bad{data.ptr, nullptr, 4, gpu::DType::f16};
  CHECK(gpu::move_grads_and_unscale(&move_bad, 1, nullptr, 0.5f, static_cast<float*>(flag.ptr),
                                    nullptr) == gpu::kInvalidInput);
  CHECK(gpu::update_scale(nullptr, nullptr, nullptr, {2.0, 0.5, 1}, nullptr) == gpu::kInvalidInput);
  REQUIRE(cudaDeviceSynchronize() == 0);
  std::vector<float> after(16);
  data.download(after.data());
  CHECK(after == ones);
  // An empty list queues nothing and finds nothing.
  CHECK(gpu::unscale_and_check(nullptr, 0, nullptr, 0.5f, static_cast<float*>(flag.ptr), nullptr) ==
        0);
  CHECK(read_flag(flag) == 0.0f);
}

TEST_CASE("CUDA update_scale follows apply_scale_rule step for step") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  DeviceBuffer scale(4), tracker(4), found(4);
  for (std::int64_t interval : {1, 2, 5}) {
    for (float start : {65536.0f, 3.0e38f, 1.0e-30f}) {
      for (std::int32_t start_tracker : {0, 9}) {  // 9 > interval: growth stalls until a backoff
        CAPTURE(interval);
        CAPTURE(start);
        CAPTURE(start_tracker);
        const ampactor::ScaleRule rule{2.0, 0.5, interval};
        ampactor::ScaleRuleState want{start, start_tracker};
        scale.upload(&start);
        tracker.upload(&start_tracker);
        for (int step = 0; step < 30; ++step) {
          const bool inf = rng() % 6 == 0;
          const float f = inf ? (step % 2 ? NAN : 1.0f) : 0.0f;
          found.upload(&f);
          require_ok(gpu::update_scale(static_cast<float*>(scale.ptr),
                                       static_cast<std::int32_t*>(tracker.ptr),
                                       static_cast<float*>(found.ptr), rule, nullptr));
          ampactor::apply_scale_rule(rule, want, inf);
          float got_scale = 0;
          std::int32_t got_tracker = -1;
          scale.download(&got_scale);
          tracker.download(&got_tracker);
          REQUIRE(got_scale == want.scale);
          REQUIRE(got_tracker == want.growth_tracker);
        }
      }
    }
  }
}

#endif  // AMPACTOR_CUDA_BUILT
