// Writes checkpoints of version 1, 2, 3... to one path with save_atomically until killed: the
// kill test's victim. Each holds "version" and an 8 MiB tensor filled with the version.
#include <ampactor/checkpoint/checkpoint.h>

#include <torch/serialize.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ampactor-checkpoint-writer PATH\n";
    return 2;
  }
  for (std::int64_t v = 1;; ++v) {
    torch::serialize::OutputArchive a;
    a.write("version", c10::IValue(v));
    a.write("data", torch::full({2 << 20}, double(v), torch::kFloat));
    ampactor::save_atomically(a, argv[1]);
  }
}
