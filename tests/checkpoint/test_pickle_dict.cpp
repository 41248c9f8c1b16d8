// ampactor's own reader of the pickle inside a torch.save'd state_dict: what Python's pickle
// writes (protocols 2, 4 and 5, byte strings made by pickle.dumps) is read exactly; anything that
// is not a flat dict of str to float or int is refused with where and why.
#include <doctest/doctest.h>

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/core/errors.h>

#include <caffe2/serialize/inline_container.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

#include "pickle_dict.h"

using ampactor::StateDict;
using ampactor::internal::PickleProblem;
using ampactor::internal::unpickle_state_dict;

namespace {

StateDict read(const std::string& bytes) {
  return unpickle_state_dict(bytes.data(), bytes.size());
}

// pickle.dumps({'scale': 1024.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
//   'growth_interval': -3, '_growth_tracker': 2**40, 'neg': -129}, protocol=P)
const std::string kProtocol2(
    "\x80\x02}q\x00(X\x05\x00\x00\x00scaleq\x01G@\x90\x00\x00\x00\x00\x00\x00X\x0d\x00\x00\x00"
    "growth_factorq\x02G@\x00\x00\x00\x00\x00\x00\x00X\x0e\x00\x00\x00"
    "backoff_factorq\x03G?\xe0\x00\x00\x00\x00\x00\x00X\x0f\x00\x00\x00"
    "growth_intervalq\x04J\xfd\xff\xff\xffX\x0f\x00\x00\x00"
    "_growth_trackerq\x05\x8a\x06\x00\x00\x00\x00\x00\x01X\x03\x00\x00\x00"
    "negq\x06J\x7f\xff\xff\xffu.",
    160);
const std::string kProtocol5(
    "\x80\x05\x95\x85\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x05scale\x94G@\x90\x00\x00\x00\x00"
    "\x00\x00\x8c\x0dgrowth_factor\x94G@\x00\x00\x00\x00\x00\x00\x00\x8c\x0e"
    "backoff_factor\x94G?\xe0\x00\x00\x00\x00\x00\x00\x8c\x0fgrowth_interval\x94J\xfd\xff\xff"
    "\xff\x8c\x0f_growth_tracker\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x03neg\x94J\x7f\xff"
    "\xff\xffu.",
    144);

StateDict expected() {
  StateDict sd;
  sd.set("scale", 1024.0);
  sd.set("growth_factor", 2.0);
  sd.set("backoff_factor", 0.5);
  sd.set("growth_interval", std::int64_t(-3));
  sd.set("_growth_tracker", std::int64_t(1) << 40);
  sd.set("neg", std::int64_t(-129));
  return sd;
}

std::string problem(const std::string& bytes) {
  try {
    read(bytes);
  } catch (const PickleProblem& e) {
    return e.what();
  }
  return "(read)";
}

}  // namespace

TEST_CASE("the pickle reader reads Python's protocols 2 and 5 exactly") {
  CHECK(read(kProtocol2) == expected());
  CHECK(read(kProtocol5) == expected());
  // protocol 4 differs from 5 in its PROTO byte alone
  std::string p4 = kProtocol5;
  p4[1] = 4;
  CHECK(read(p4) == expected());
  CHECK(read(std::string("\x80\x02\x7d\x71\x00\x2e", 6)).empty());  // {}
  // {'a': 1e309} is inf in Python; it is read, and load_state_dict refuses it
  const StateDict inf =
      read(std::string("\x80\x02}q\x00X\x01\x00\x00\x00"
                       "aq\x01G\x7f\xf0\x00\x00\x00\x00\x00\x00s.",
                       24));
  CHECK(std::isinf(std::get<double>(inf.at("a"))));
}

TEST_CASE("the pickle reader refuses what is not a flat dict of str to float or int") {
  // {'a': True}, {'a': {'b': 1.0}}, {1: 1.0}, {'big': 2**70}
  CHECK(problem(std::string("\x80\x02}q\x00X\x01\x00\x00\x00"
                            "aq\x01\x88s.",
                            16)) ==
        "state_dict['a'] must be a float or an int, got a bool (byte 14)");
  CHECK(problem(std::string("\x80\x02}q\x00X\x01\x00\x00\x00"
                            "aq\x01}q\x02X\x01\x00\x00\x00"
                            "bq\x03G?\xf0\x00\x00\x00\x00\x00\x00ss.",
                            36)) ==
        "a dict inside the state_dict (it holds floats and ints only) (byte 33)");
  CHECK(problem(std::string("\x80\x02}q\x00K\x01G?\xf0\x00\x00\x00\x00\x00\x00s.", 18)) ==
        "a state_dict's keys are strings, got a int (byte 16)");
  CHECK(problem(std::string("\x80\x02}q\x00X\x03\x00\x00\x00"
                            "bigq\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@s.",
                            28)) == "an int wider than 64 bits (byte 15)");
  // a list, an opcode no state_dict needs
  CHECK(problem(std::string("\x80\x02]q\x00.", 6)) ==
        "pickle opcode 0x5d, which a dict of floats and ints does not contain (byte 2)");
  // cut short (inside growth_interval's key), bytes after STOP, STOP on an empty stack
  CHECK(problem(kProtocol2.substr(0, 100)) == "the pickle ends inside an opcode (byte 91)");
  CHECK(problem(kProtocol2 + "x") == "bytes after the pickle's end (byte 160)");
  CHECK(problem(std::string("\x80\x02.", 3)) == "the pickle does not end with one dict (byte 2)");
}

TEST_CASE("a length field past the end is refused before anything is allocated") {
  // Found by ampactor-fuzz-checkpoint: a key's BINUNICODE length of 0xfff6000e (4 GiB) made
  // LibTorch's unpickler allocate that much. The reproducer (the fuzzer's input: a mode byte,
  // then the pickle) is kept in fuzz/corpus/checkpoint.
  std::ifstream in(std::string(AMPACTOR_FUZZ_CORPUS) + "/finding-pickle-length-4gib",
                   std::ios::binary);
  REQUIRE(in);
  const std::string input{std::istreambuf_iterator<char>(in), {}};
  CHECK(problem(input.substr(1)) == "the pickle ends inside an opcode (byte 61)");
  // Through the public reader, in a well-formed torch.save archive: a refusal, no allocation.
  std::string file;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, std::size_t n) {
      file.append(static_cast<const char*>(p), n);
      return n;
    });
    zip.writeRecord("data.pkl", input.data() + 1, input.size() - 1);
    zip.writeRecord("byteorder", "little", 6);
  }
  CHECK_THROWS_WITH_AS(ampactor::read_torch_state_dict(file.data(), file.size(), "crafted.pt"),
                       "'crafted.pt' is not a GradScaler state_dict: the pickle ends inside an "
                       "opcode (byte 61)",
                       ampactor::ScalerError);
}
