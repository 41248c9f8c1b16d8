// libFuzzer target: the checkpoint readers. The first byte picks what the rest is:
//  even:        a whole file, as load_checkpoint and read_torch_state_dict read it;
//  1 (mod 4):   the pickle inside a well-formed torch.save archive (the zip's CRCs made right),
//               so the fuzzer reaches the unpickler and the state_dict checks behind the CRC check;
//  3 (mod 4):   data.pkl inside an ampactor checkpoint (its code and tensors kept), so the fuzzer
//               reaches load_checkpoint's pickle screen and, past it, LibTorch's reader.
// Every refusal must be a ScalerError, a refused state_dict must leave the scaler unchanged, and
// every tensor of a loaded checkpoint must be readable whole.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/core/errors.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/api/include/torch/serialize/input-archive.h>
#include <torch/csrc/api/include/torch/serialize/output-archive.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <utility>
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

/// Every tensor `value` holds copied whole (ASan sees an element outside its storage).
void read_tensors(const c10::IValue& value) {
  // Not a huge view of a small storage: its copy would be huge, which is no error.
  if (value.isTensor() && value.toTensor().numel() <= (1 << 20))
    value.toTensor().clone(at::MemoryFormat::Contiguous);
  if (value.isTuple())
    for (const c10::IValue& item : value.toTupleRef().elements())
      read_tensors(item);
}

/// Every value of a loaded archive read, each nested archive once (one may be held many times).
void read_all(torch::serialize::InputArchive& archive, std::set<const void*>& seen) {
  for (const std::string& key : archive.keys()) {
    c10::IValue value;
    if (!archive.try_read(key, value)) continue;
    read_tensors(value);
    torch::serialize::InputArchive nested;
    if (value.isObject() && seen.insert(value.toObject().get()).second &&
        archive.try_read(key, nested))
      read_all(nested, seen);
  }
}

void read_file(const char* data, std::size_t size) {
  try {
    torch::serialize::InputArchive archive;
    ampactor::load_checkpoint(archive, data, size, "fuzz");
    std::set<const void*> seen;
    read_all(archive, seen);
    load_into_scaler(ampactor::read_state_dict(archive));
  } catch (const ampactor::ScalerError&) {
  }
  try {
    load_into_scaler(ampactor::read_torch_state_dict(data, size, "fuzz"));
  } catch (const ampactor::ScalerError&) {
  }
}

using Records = std::vector<std::pair<std::string, std::string>>;

/// The archive LibTorch's writer makes of `records` and data.pkl (it writes "version" itself).
std::vector<char> archive_of(const Records& records, const char* pickle, std::size_t size) {
  std::vector<char> out;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, std::size_t n) {
      out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
      return n;
    });
    zip.writeRecord("data.pkl", pickle, size);
    for (const auto& [name, data] : records)
      zip.writeRecord(name, data.data(), data.size());
  }
  return out;
}

/// The records of an ampactor checkpoint but data.pkl and version: a scaler nested in a module
/// with a tensor and values of each kind. Its data.pkl is the seed ckpt-pickle-template.
const Records& checkpoint_records() {
  static const Records records = [] {
    torch::serialize::OutputArchive root, scaler(root.compilation_unit());
    ampactor::LocalGradScaler().save(scaler);
    root.write("w", at::arange(6, at::kFloat).reshape({2, 3}));
    root.write("step", c10::IValue(std::int64_t(7)));
    root.write("name", c10::IValue(std::string("run")));
    root.write("pair", c10::IValue(std::make_tuple(1.5, true)));
    root.write("none", c10::IValue());
    root.write("scaler", scaler);
    std::ostringstream bytes;
    root.save_to(bytes);
    std::istringstream in(bytes.str());
    caffe2::serialize::PyTorchStreamReader zip(&in);
    Records out;
    for (const std::string& name : zip.getAllRecords()) {
      if (name == "data.pkl" || name == "version") continue;
      auto [data, n] = zip.getRecord(name);
      out.emplace_back(name, std::string(static_cast<const char*>(data.get()), n));
    }
    return out;
  }();
  return records;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* rest = reinterpret_cast<const char*>(data) + 1;
  if (data[0] % 2 == 0) {
    read_file(rest, size - 1);
  } else if (data[0] % 4 == 1) {
    const std::vector<char> file = archive_of({{"byteorder", "little"}}, rest, size - 1);
    read_file(file.data(), file.size());
  } else {
    const std::vector<char> file = archive_of(checkpoint_records(), rest, size - 1);
    read_file(file.data(), file.size());
  }
  return 0;
}
