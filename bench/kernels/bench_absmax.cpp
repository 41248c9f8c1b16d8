// ampactor-bench-absmax: what the largest-finite-|gradient| reduction costs the fused kernels.
// Each kernel runs with and without grad_absmax on the same list, alternately, repetition by
// repetition (this machine is noisy: interleaving gives both forms the same conditions), and the
// ratio of the medians is reported. Goal: the max form keeps >= 0.95x of the plain form's speed.
// --attribution: the measured form (with grad_absmax, as the scalers call it) against the same
// with the overflow attribution (Measures::nonfinite, its flags zeroed in each call) on clean
// gradients. Goal: <= 2% slower (ratio >= 0.98).
#include <ampactor/kernels/unscale.h>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <vector>

#include "bench_setup.h"
#include "bench_util.h"

namespace k = ampactor::kernels;
using ampactor::bench::Clock;
using ampactor::bench::median_of;

namespace {

// A model's mix: `count` tensors log-uniform over a 1000x range of sizes, `bytes` in all.
std::vector<at::Tensor> make_grads(std::int64_t bytes, int count, at::ScalarType dtype) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, std::log(1000.0));
  std::vector<double> w(std::size_t(count), 0);
  double sum = 0;
  for (double& x : w)
    sum += (x = std::exp(u(rng)));
  const std::int64_t elems = bytes / std::int64_t(c10::elementSize(dtype));
  std::vector<at::Tensor> out;
  for (double x : w)
    out.push_back(
        (at::randn({std::max<std::int64_t>(1, std::int64_t(double(elems) * x / sum))}) * 16)
            .to(dtype));
  return out;
}

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Pair {
  double plain = 0, with_max = 0;  // median seconds
};

Pair side_by_side(const std::function<void()>& plain, const std::function<void()>& with_max,
                  int reps) {
  plain();
  with_max();  // warm-up
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    if (i % 2) {  // alternate which goes first
      a.push_back(seconds(plain));
      b.push_back(seconds(with_max));
    } else {
      b.push_back(seconds(with_max));
      a.push_back(seconds(plain));
    }
  }
  return {median_of(a), median_of(b)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-absmax: the fused kernels with and without grad_absmax"};
  std::int64_t mb = 64;
  int count = 128, reps = 41;
  std::vector<int> threads{1, 2};
  std::string json_path;
  bool attribution = false;
  app.add_option("--mb", mb, "gradient bytes per list, in MiB")->check(CLI::Range(1, 1 << 14));
  app.add_option("--tensors", count, "tensors per list")->check(CLI::Range(1, 100000));
  app.add_option("--reps", reps, "repetitions of each form")->check(CLI::Range(3, 100000));
  app.add_option("--threads", threads, "thread counts")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write the figures as JSON to this file");
  app.add_flag("--attribution", attribution,
               "with grad_absmax against with grad_absmax and nonfinite (goal >= 0.98)");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json out = nlohmann::json::object();
  const double goal = attribution ? 0.98 : 0.95;
  std::cout << "ampactor-bench-absmax: " << mb << " MiB per list in " << count
            << " tensors, CPU loops '" << k::cpu_loop_variant() << "', " << reps
            << " repetitions of each form, interleaved"
            << (attribution ? "; with the max, without and with the attribution" : "") << "\n\n"
            << std::left << std::setw(10) << "dtype" << std::setw(9) << "threads" << std::setw(22)
            << "kernel" << std::right << std::setw(12) << (attribution ? "max GB/s" : "plain GB/s")
            << std::setw(12) << (attribution ? "attr GB/s" : "max GB/s") << std::setw(10) << "ratio"
            << "  goal >= " << goal << "\n";
  bool all_met = true;
  for (int t : threads) {
    at::set_num_threads(t);
    for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const std::string name = dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16";
      auto grads = make_grads(mb << 20, count, dtype);
      std::vector<at::Tensor> masters;
      for (const auto& g : grads)
        masters.push_back(at::empty(g.sizes(), at::kFloat));
      double bytes = 0;
      for (const auto& g : grads)
        bytes += double(g.numel() * std::int64_t(g.element_size()));
      at::Tensor found = at::zeros({}), absmax = at::zeros({});
      at::Tensor flags = at::zeros({std::int64_t(grads.size())}, at::kByte);
      const auto measured = k::Measures().grad_absmax(absmax);
      const auto attributed = k::Measures().grad_absmax(absmax).nonfinite(flags);
      int flip = 0;  // alternating 0.5 and 2 keeps the values normal
      auto inv = [&] { return (flip++ & 1) ? 2.0f : 0.5f; };
      const std::vector<std::pair<std::string, Pair>> rows =
          attribution
              ? std::vector<std::pair<std::string, Pair>>{{"unscale+check",
                                                           side_by_side(
                                                               [&] {
                                                                 k::unscale_and_check(
                                                                     grads, inv(), found, measured);
                                                               },
                                                               [&] {
                                                                 flags.zero_();
                                                                 k::unscale_and_check(grads, inv(),
                                                                                      found,
                                                                                      attributed);
                                                               },
                                                               reps)},
                                                          {"check-only",
                                                           side_by_side(
                                                               [&] {
                                                                 k::check_finite(grads, found,
                                                                                 measured);
                                                               },
                                                               [&] {
                                                                 flags.zero_();
                                                                 k::check_finite(grads, found,
                                                                                 attributed);
                                                               },
                                                               reps)},
                                                          {"grad move to fp32",
                                                           side_by_side(
                                                               [&] {
                                                                 k::move_grads_and_unscale(
                                                                     grads, masters, 0.5f, found,
                                                                     measured);
                                                               },
                                                               [&] {
                                                                 flags.zero_();
                                                                 k::move_grads_and_unscale(
                                                                     grads, masters, 0.5f, found,
                                                                     attributed);
                                                               },
                                                               reps)}}
              : std::vector<std::pair<std::string, Pair>>{
                    {"unscale+check",
                     side_by_side([&] { k::unscale_and_check(grads, inv(), found); },
                                  [&] { k::unscale_and_check(grads, inv(), found, absmax); },
                                  reps)},
                    {"check-only",
                     side_by_side([&] { k::check_finite(grads, found); },
                                  [&] { k::check_finite(grads, found, absmax); }, reps)},
                    {"grad move to fp32",
                     side_by_side(
                         [&] { k::move_grads_and_unscale(grads, masters, 0.5f, found); },
                         [&] { k::move_grads_and_unscale(grads, masters, 0.5f, found, absmax); },
                         reps)}};
      for (const auto& [kernel, p] : rows) {
        const double ratio = p.plain / p.with_max;
        all_met = all_met && (kernel != "unscale+check" || ratio >= goal);
        std::cout << std::left << std::setw(10) << name << std::setw(9) << t << std::setw(22)
                  << kernel << std::right << std::fixed << std::setprecision(2) << std::setw(12)
                  << bytes / p.plain / 1e9 << std::setw(12) << bytes / p.with_max / 1e9
                  << std::setw(10) << ratio << "\n";
        const std::string key = name + "/t" + std::to_string(t) + "/" + kernel;
        out[key + (attribution ? "/max_GBps" : "/plain_GBps")] = bytes / p.plain / 1e9;
        out[key + (attribution ? "/attr_GBps" : "/max_GBps")] = bytes / p.with_max / 1e9;
        out[key + "/ratio"] = ratio;
      }
    }
  }
  std::cout << "\nunscale+check " << (attribution ? "with the attribution" : "with the max")
            << " at >= " << goal << "x of without, everywhere: " << (all_met ? "met" : "NOT met")
            << "\n";
  if (!json_path.empty()) {
    out["setup"] = ampactor::bench::run_setup();
    std::ofstream f(json_path);
    f << std::setw(2) << out << "\n";
    if (!f) {
      std::cerr << "--json: cannot write " << json_path << "\n";
      return 2;
    }
  }
  return 0;
}
