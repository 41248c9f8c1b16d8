// Misuse that must fail fast with a clear message instead of hanging: run by
// test_failure_modes.cpp in a child process.
//   ampactor-misuse-child foreign-thread | inside-job
#include <ampactor/grad_scaler.h>

#include <ATen/ops/ones.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

int main(int argc, char** argv) {
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
