// libFuzzer target: the checkpoint readers. The first byte picks what the rest is:
//  even: a whole file, as load_checkpoint and read_torch_state_dict read it;
//  odd:  the pickle inside a well-formed torch.save archive (the zip's CRCs made right), so the
//        fuzzer reaches the unpickler and the state_dict checks behind the CRC check.
// Every refusal must be a ScalerError, and a refused state_dict must leave the scaler unchanged.
#include <ampactor/scaler/checkpoint.h>
#include <ampactor/scaler/errors.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/api/include/torch/serialize/input-archive.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: invariant broken: %s\n", what);
  std::abort();
}

/// The state_dict given to a fresh scaler: taken whole, or refused with the state unchanged.
void load_into_scaler(const ampactor::StateDict& sd) {
  ampactor::LocalGradScaler scaler;
  const ampactor::StateDict before = scaler.state_dict();
  try {
    scaler.load_state_dict(sd);
  } catch (const ampactor::ScalerError&) {
    if (!(scaler.state_dict() == before)) broken("a refused state_dict changed the scaler");
  }
}

void read_file(const char* data, std::size_t size) {
  try {
    torch::serialize::InputArchive archive;
    ampactor::load_checkpoint(archive, data, size, "fuzz");
    load_into_scaler(ampactor::read_state_dict(archive));
  } catch (const ampactor::ScalerError&) {
  }
  try {
    load_into_scaler(ampactor::read_torch_state_dict(data, size, "fuzz"));
  } catch (const ampactor::ScalerError&) {
  }
}

std::vector<char> torch_save_archive(const char* pickle, std::size_t size) {
  std::vector<char> out;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, std::size_t n) {
      out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
      return n;
    });
    zip.writeRecord("data.pkl", pickle, size);
    zip.writeRecord("byteorder", "little", 6);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* rest = reinterpret_cast<const char*>(data) + 1;
  if (data[0] % 2 == 0) {
    read_file(rest, size - 1);
  } else {
    const std::vector<char> file = torch_save_archive(rest, size - 1);
    read_file(file.data(), file.size());
  }
  return 0;
}
