// ampactor-bench-kernels: bandwidth of the fused CPU kernels beside a plain copy of the same
// bytes and beside LibTorch's unfused equivalents, on realistic gradient lists, measured side by
// side in one run. Not a test: it reports figures (and ratios) and never fails on them.
#include <ampactor/kernels/unscale.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_gpu.h"
#include "bench_setup.h"

namespace k = ampactor::kernels;
using Clock = std::chrono::steady_clock;

namespace {

/// `count` tensors whose element counts are log-uniform over a 1000x range and add up to
/// `total_bytes` of `dtype`: a model's mix of biases, norms and weight matrices.
std::vector<at::Tensor> make_grads(std::int64_t total_bytes, int count, at::ScalarType dtype,
                                   std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, std::log(1000.0));
  std::vector<double> w(count);
  double sum = 0;
  for (double& x : w)
    sum += (x = std::exp(u(rng)));
  const std::int64_t elems = total_bytes / std::int64_t(c10::elementSize(dtype));
  std::vector<at::Tensor> out;
  for (double x : w) {
    std::int64_t n = std::max<std::int64_t>(1, std::int64_t(double(elems) * x / sum)) | 1;
    out.push_back((at::randn({n}, at::kFloat) * 16).to(dtype));
  }
  return out;
}

std::int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  std::int64_t b = 0;
  for (auto& t : ts)
    b += t.numel() * std::int64_t(t.element_size());
  return b;
}

/// Median wall time of `fn` over repetitions: at least `min_reps`, more until `min_seconds`.
template <typename F>
double median_seconds(F&& fn, int min_reps, double min_seconds) {
  fn();  // warm-up: page faults, thread pool start
  std::vector<double> times;
  double spent = 0;
  while (int(times.size()) < min_reps || (spent < min_seconds && times.size() < 200)) {
    auto t0 = Clock::now();
    fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    times.push_back(s);
    spent += s;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// The memory-bandwidth reference: memcpy of the same bytes, chunked and threaded like the kernels.
void parallel_copy(const std::vector<at::Tensor>& src, std::vector<at::Tensor>& dst) {
  struct Piece {
    const char* s;
    char* d;
    std::size_t n;
  };
  std::vector<Piece> pieces;
  const std::size_t chunk = std::size_t(1) << 18;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const std::size_t bytes = std::size_t(src[i].numel()) * src[i].element_size();
    const char* s = static_cast<const char*>(src[i].data_ptr());
    char* d = static_cast<char*>(dst[i].data_ptr());
    for (std::size_t o = 0; o < bytes; o += chunk)
      pieces.push_back({s + o, d + o, std::min(chunk, bytes - o)});
  }
  at::parallel_for(0, std::int64_t(pieces.size()), 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      std::memcpy(pieces[i].d, pieces[i].s, pieces[i].n);
  });
}

/// Streaming limits of this machine, in the same chunks and threads as the kernels: a read-only
/// pass (OR of every word) and an in-place read-modify-write pass. These are the ceilings for
/// check-only and for the fused unscale.
template <typename F>
void for_each_chunk(const std::vector<at::Tensor>& ts, F&& fn) {
  struct Piece {
    std::uint64_t* p;
    std::size_t n;
  };
  std::vector<Piece> pieces;
  const std::size_t chunk = std::size_t(1) << 15;  // 64-bit words
  for (auto& t : ts) {
    const std::size_t words = std::size_t(t.numel()) * t.element_size() / 8;
    auto* base = static_cast<std::uint64_t*>(t.data_ptr());
    for (std::size_t o = 0; o < words; o += chunk)
      pieces.push_back({base + o, std::min(chunk, words - o)});
  }
  at::parallel_for(0, std::int64_t(pieces.size()), 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      fn(pieces[i].p, pieces[i].n);
  });
}

// Hand-unrolled AVX2 when the CPU has it: the ceilings must not be limited by the loop itself.
__attribute__((target("avx2"))) std::uint64_t or_words_avx2(const std::uint64_t* p, std::size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_or_si256(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_or_si256(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_or_si256(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_or_si256(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3)));
  std::uint64_t acc = lanes[0] | lanes[1] | lanes[2] | lanes[3];
  for (; i < n; ++i)
    acc |= p[i];
  return acc;
}

__attribute__((target("avx2"))) void xor_words_avx2(std::uint64_t* p, std::size_t n) {
  const __m256i m = _mm256_set1_epi64x(std::int64_t(0x8000000080000000ull));
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    auto* v = reinterpret_cast<__m256i*>(p + i);
    _mm256_storeu_si256(v, _mm256_xor_si256(_mm256_loadu_si256(v), m));
  }
  for (; i < n; ++i)
    p[i] ^= 0x8000000080000000ull;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

std::uint64_t read_stream(const std::vector<at::Tensor>& ts) {
  std::atomic<std::uint64_t> out{0};
  for_each_chunk(ts, [&](const std::uint64_t* p, std::size_t n) {
    std::uint64_t acc = 0;
    if (kHaveAvx2) {
      acc = or_words_avx2(p, n);
    } else {
      for (std::size_t i = 0; i < n; ++i)
        acc |= p[i];
    }
    out.fetch_or(acc, std::memory_order_relaxed);
  });
  return out.load();
}

void rmw_stream(const std::vector<at::Tensor>& ts) {
  for_each_chunk(ts, [](std::uint64_t* p, std::size_t n) {
    if (kHaveAvx2) return xor_words_avx2(p, n);  // flips float signs
    for (std::size_t i = 0; i < n; ++i)
      p[i] ^= 0x8000000080000000ull;
  });
}

/// What a LibTorch 1.13 user writes on the CPU, where torch's fused kernel does not exist.
bool libtorch_unscale(std::vector<at::Tensor>& grads, double inv) {
  bool found = false;
  for (auto& g : grads) {
    found |= !at::isfinite(g).all().item<bool>();
    g.mul_(inv);
  }
  return found;
}

struct Results {
  nlohmann::json json = nlohmann::json::object();
  void put(const std::string& key, double v) { json[key] = v; }
};

void row(const std::string& label, double gbps, const std::string& note = "") {
  std::cout << "  " << std::left << std::setw(38) << label << std::right << std::setw(9)
            << std::fixed << std::setprecision(2) << gbps << " GB/s  " << note << "\n";
}

std::string ratio_text(double r, double goal) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << r << "x (goal >= " << goal
    << "x: " << (r >= goal ? "met" : "NOT met") << ")";
  return s.str();
}

void run_size(std::int64_t total_bytes, int count, int threads, int min_reps, double min_seconds,
              Results& res) {
  at::set_num_threads(threads);
  const std::string tag = std::to_string(total_bytes >> 20) + "MB/t" + std::to_string(threads);
  std::cout << "\n[" << (total_bytes >> 20) << " MB of fp32 grads in " << count << " tensors, "
            << threads << " thread(s)]\n";
  auto grads = make_grads(total_bytes, count, at::kFloat, 1);
  const double gb = double(bytes_of(grads)) / 1e9;
  std::vector<at::Tensor> copy_dst;
  for (auto& g : grads)
    copy_dst.push_back(at::empty_like(g));
  at::Tensor found = at::zeros({}, at::kFloat);
  // Alternating 0.5 and 2 keeps values normal (subnormals would slow any multiply).
  int flip = 0;
  auto next_inv = [&] { return (flip++ & 1) ? 2.0f : 0.5f; };

  const double t_copy =
      median_seconds([&] { parallel_copy(grads, copy_dst); }, min_reps, min_seconds);
  volatile std::uint64_t sink = 0;
  const double t_read =
      median_seconds([&] { sink = sink + read_stream(grads); }, min_reps, min_seconds);
  const double t_rmw = median_seconds([&] { rmw_stream(grads); }, min_reps, min_seconds);
  const double t_fused = median_seconds([&] { k::unscale_and_check(grads, next_inv(), found); },
                                        min_reps, min_seconds);
  const double t_torch =
      median_seconds([&] { libtorch_unscale(grads, next_inv()); }, min_reps, min_seconds);
  const double t_check =
      median_seconds([&] { k::check_finite(grads, found); }, min_reps, min_seconds);

  // Grad move: fp16 model grads with the same element counts into fp32 masters.
  std::vector<at::Tensor> model, master;
  for (auto& g : grads) {
    model.push_back(g.to(at::kHalf));
    master.push_back(at::empty_like(g));
  }
  const double t_move =
      median_seconds([&] { k::move_grads_and_unscale(model, master, 1.0f / 1024.0f, found); },
                     min_reps, min_seconds);
  const double t_move_torch = median_seconds(
      [&] {
        for (std::size_t i = 0; i < model.size(); ++i)
          master[i].copy_(model[i]);
        libtorch_unscale(master, 1.0 / 1024.0);
      },
      min_reps, min_seconds);
  const double move_gb = double(bytes_of(model)) / 1e9;

  row("copy (memcpy, reference)", gb / t_copy);
  row("read-only stream (ceiling)", gb / t_read);
  row("in-place read+write stream (ceiling)", gb / t_rmw);
  row("fused unscale+check", gb / t_fused, ratio_text(t_copy / t_fused, 0.85) + " of copy");
  row("LibTorch isfinite().all() + mul_", gb / t_torch,
      "fused is " + ratio_text(t_torch / t_fused, 3.0));
  row("check-only", gb / t_check, ratio_text(t_fused / t_check, 1.6) + " of fused unscale");
  {
    std::ostringstream s;
    s << std::fixed << std::setprecision(2) << "machine ceiling for that ratio: " << t_rmw / t_read
      << "x; fused at " << t_rmw / t_fused * 100 << "% of the read+write stream, check-only at "
      << t_read / t_check * 100 << "% of the read stream";
    std::cout << "  " << s.str() << "\n";
  }
  row("fused grad move fp16->fp32", move_gb / t_move, "(GB of fp16 grads read per second)");
  row("LibTorch copy_ + unscale", move_gb / t_move_torch,
      "fused is " + ratio_text(t_move_torch / t_move, 2.0));

  res.put(tag + "/copy_GBps", gb / t_copy);
  res.put(tag + "/read_stream_GBps", gb / t_read);
  res.put(tag + "/rmw_stream_GBps", gb / t_rmw);
  res.put(tag + "/ratio_rmw_vs_read_ceiling", t_rmw / t_read);
  res.put(tag + "/ratio_fused_vs_rmw_stream", t_rmw / t_fused);
  res.put(tag + "/ratio_check_vs_read_stream", t_read / t_check);
  res.put(tag + "/fused_unscale_GBps", gb / t_fused);
  res.put(tag + "/libtorch_unscale_GBps", gb / t_torch);
  res.put(tag + "/check_only_GBps", gb / t_check);
  res.put(tag + "/fused_move_GBps", move_gb / t_move);
  res.put(tag + "/libtorch_move_GBps", move_gb / t_move_torch);
  res.put(tag + "/ratio_fused_vs_copy", t_copy / t_fused);
  res.put(tag + "/ratio_fused_vs_libtorch", t_torch / t_fused);
  res.put(tag + "/ratio_check_vs_fused", t_fused / t_check);
  res.put(tag + "/ratio_move_vs_libtorch", t_move_torch / t_move);
}

void run_half_types(std::int64_t total_bytes, int count, int threads, int min_reps,
                    double min_seconds, Results& res) {
  at::set_num_threads(threads);
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    const std::string name = dtype == at::kHalf ? "fp16" : "bf16";
    const std::string tag =
        std::to_string(total_bytes >> 20) + "MB/t" + std::to_string(threads) + "/" + name;
    auto grads = make_grads(total_bytes, count, dtype, 2);
    const double gb = double(bytes_of(grads)) / 1e9;
    at::Tensor found = at::zeros({}, at::kFloat);
    int flip = 0;
    const double t_fused =
        median_seconds([&] { k::unscale_and_check(grads, (flip++ & 1) ? 2.0f : 0.5f, found); },
                       min_reps, min_seconds);
    const double t_torch = median_seconds(
        [&] { libtorch_unscale(grads, (flip++ & 1) ? 2.0 : 0.5); }, min_reps, min_seconds);
    const double t_check =
        median_seconds([&] { k::check_finite(grads, found); }, min_reps, min_seconds);
    std::cout << "\n[" << (total_bytes >> 20) << " MB of " << name << " grads, " << threads
              << " thread(s)]\n";
    row("fused unscale+check", gb / t_fused, "vs LibTorch " + ratio_text(t_torch / t_fused, 3.0));
    row("LibTorch isfinite().all() + mul_", gb / t_torch);
    row("check-only", gb / t_check);
    res.put(tag + "/fused_unscale_GBps", gb / t_fused);
    res.put(tag + "/libtorch_unscale_GBps", gb / t_torch);
    res.put(tag + "/check_only_GBps", gb / t_check);
    res.put(tag + "/ratio_fused_vs_libtorch", t_torch / t_fused);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-kernels: fused unscale/check/move bandwidth vs copy and LibTorch"};
  std::vector<std::int64_t> sizes_mb{1, 16, 256, 1024};
  int count = 128;
  std::vector<std::string> threads_opt{"1", "all"};
  int min_reps = 5;
  double min_seconds = 0.5;
  std::string json_path;
  bool quick = false;
  app.add_option("--sizes-mb", sizes_mb, "total fp32 gradient sizes in MiB")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--tensors", count, "tensors per gradient list")->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads_opt, "thread counts to run: numbers or 'all'")
      ->delimiter(',');
  app.add_option("--min-reps", min_reps, "minimum repetitions per figure")
      ->check(CLI::Range(1, 1000));
  app.add_option("--min-seconds", min_seconds, "minimum time per figure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "write the figures as JSON (name -> value) to this file");
  app.add_flag("--quick", quick, "small sizes and few repetitions (a smoke run)");
  std::vector<std::int64_t> gpu_sizes_mb{16, 256, 1024};
  bool gpu_only = false;
  app.add_option("--gpu-sizes-mb", gpu_sizes_mb, "total fp32 gradient sizes on the GPU in MiB")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_flag("--gpu-only", gpu_only, "only the GPU figures");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    sizes_mb = {1, 16};
    min_reps = 3;
    min_seconds = 0.05;
    gpu_sizes_mb = {16};
  }
  const int all = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> threads;
  for (const std::string& t : threads_opt) {
    if (t == "all") {
      threads.push_back(all);
      continue;
    }
    try {
      int n = std::stoi(t);
      if (n < 1) throw std::invalid_argument(t);
      threads.push_back(n);
    } catch (const std::exception&) {
      std::cerr << "--threads: '" << t << "' is not a positive number or 'all'\n";
      return 2;
    }
  }
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);
    if (!json_file) {
      std::cerr << "--json: cannot write " << json_path << "\n";
      return 2;
    }
  }

  std::cout << "ampactor-bench-kernels: CPU loops '" << k::cpu_loop_variant() << "', " << all
            << " hardware thread(s) available\n";
  Results res;
  if (!gpu_only) {
    for (int t : threads)
      for (std::int64_t mb : sizes_mb)
        run_size(mb << 20, count, t, min_reps, min_seconds, res);
    const std::int64_t half_mb = std::min<std::int64_t>(64, sizes_mb.back());
    for (int t : threads)
      run_half_types(half_mb << 20, count, t, min_reps, min_seconds, res);
  }
  ampactor::bench::run_gpu_figures({gpu_sizes_mb, count, min_reps}, res.json);
  res.json["meta/threads_all"] = all;
  res.json["meta/tensors"] = count;
  if (!json_path.empty()) {
    res.json["setup"] = ampactor::bench::run_setup();
    json_file << std::setw(2) << res.json << "\n";
    std::cout << "\nwrote " << json_path << "\n";
  }
  return 0;
}
