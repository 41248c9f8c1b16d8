// What test_failure_modes.cpp runs in a child process:
//   ampactor-test-child foreign-thread | inside-job   misuse that must end, not hang
//   ampactor-test-child record TRACE                  trains with a recorded trace until killed
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/trace/trace.h>

#include <ATen/ops/ones.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

namespace {

/// Iterations of a tiny model with a recorded trace, an overflow now and then, until killed.
int record(const char* path) {
  ampactor::GradScaler scaler(ampactor::GradScalerOptions().init_scale(1024).growth_interval(5),
                              ampactor::ScalePolicy::exact, ampactor::record_trace(path));
  at::Tensor w = at::ones({16}).set_requires_grad(true);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1e-3));
  std::cout << "recording" << std::endl;
  for (long k = 0;; ++k) {
    opt.zero_grad();
    at::Tensor loss = (w * w).sum();
    if (k % 13 == 7) loss = loss * INFINITY;
    scaler.scale(loss).backward();
    scaler.submit([&] { scaler.step(opt); });
    scaler.update();
    scaler.sync();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "record") == 0) return record(argv[2]);
  if (argc != 2) return 2;
  auto scaler = std::make_unique<ampactor::GradScaler>();
  scaler->scale(at::ones({1}));
  if (std::strcmp(argv[1], "foreign-thread") == 0) {
    std::thread([&] { scaler.reset(); }).join();  // destroyed on a thread that did not build it
  } else if (std::strcmp(argv[1], "inside-job") == 0) {
    ampactor::GradScaler* raw = scaler.release();
    raw->run_on_optimizer([raw] { delete raw; });  // destroyed inside its own step job
  } else {
    return 2;
  }
  std::cout << "returned\n";
  return 0;
}
