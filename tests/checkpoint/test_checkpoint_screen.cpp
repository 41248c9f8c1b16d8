// load_checkpoint's checks before LibTorch reads an archive: the zip laid out as LibTorch lays it
// out, every copy of a value agreeing (data descriptors included), and the archive holding only
// what ampactor's checkpoints hold (no code but attribute declarations, no GLOBAL but the
// archive's classes, tensors and storages, tensors inside their storages). Each refusal is a
// ScalerError(bad_checkpoint) naming what is wrong, and changes nothing.
#include "doctest_torch.h"

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/serialize.h>

#include <functional>
#include <memory>
#include <string>

#include "archive_fixture.h"
#include "checkpoint_fixture.h"
#include "refusal.h"
#include "zip_fixture.h"

using namespace ampactor;
using ampactor::test::patched;
using ampactor::test::record_of;
using ampactor::test::Refusal;
using ampactor::test::with_record;
using ampactor::test::ZipView;

namespace {

/// A LocalGradScaler's archive: one module of floats and ints.
std::string scaler_archive() {
  torch::serialize::OutputArchive a;
  LocalGradScaler().save(a);
  return ampactor::test::bytes_of(a);
}

/// Two tensors and an int: two storages, BININT2 1445 for the int.
std::string tensor_archive() {
  torch::serialize::OutputArchive a;
  a.write("w", torch::arange(77, torch::kFloat));
  a.write("v", torch::ones({2, 3}, torch::kDouble));
  a.write("step", c10::IValue(std::int64_t(1445)));
  return ampactor::test::bytes_of(a);
}

Refusal load_refusal(const std::string& bytes) {
  torch::serialize::InputArchive a;
  return ampactor::test::refusal_of(
      [&] { load_checkpoint(a, bytes.data(), bytes.size(), "t.pt"); });
}

/// A corpus file of the checkpoint fuzzer, without the byte that picks the fuzzer's mode.
std::string corpus(const std::string& name) {
  const std::vector<char> f = ampactor::test::read_bytes(AMPACTOR_FUZZ_CORPUS "/" + name);
  return std::string(f.begin() + 1, f.end());
}

void check_refused(const std::string& bytes, const std::string& says) {
  const Refusal r = load_refusal(bytes);
  CHECK(r.code == errc::bad_checkpoint);
  CHECK_MESSAGE(r.mentions(says), r.what);
}

}  // namespace

TEST_CASE("The fuzzer's type-parser finding is refused with a ScalerError, and nothing changes") {
  const std::string finding = corpus("finding-libtorch-typeparser-null-read");
  LocalGradScaler s(GradScalerOptions().init_scale(96).growth_interval(7));
  const StateDict before = s.state_dict();
  torch::serialize::InputArchive a = ampactor::test::archive_of(tensor_archive());
  const Refusal r = ampactor::test::refusal_of([&] {
    load_checkpoint(a, finding.data(), finding.size(), "finding.pt");
    s.load(a);
  });
  CHECK(r.code == errc::bad_checkpoint);
  CHECK(r.what ==
        "checkpoint 'finding.pt' is truncated or corrupt: its zip64 and zip end records disagree");
  CHECK(s.state_dict() == before);
  c10::IValue step;  // the archive keeps what it held
  CHECK((a.try_read("step", step) && step.toInt() == 1445));
  CHECK_THROWS_WITH_AS(read_torch_state_dict(finding.data(), finding.size(), "finding.pt"),
                       doctest::Contains("its zip64 and zip end records disagree"), ScalerError);
}

TEST_CASE("Undone one by one, each of the finding's changes is refused by the check that sees it") {
  // The finding is file-scaler_archive changed four ways: an end record saying 0 entries (the
  // zip64 record, which LibTorch reads, says 5), a class declaration broken under its old CRC,
  // and the source map (which LibTorch reads to report the broken code) changed, with a
  // directory CRC changed too but not to match it.
  const std::string original = corpus("file-scaler_archive");
  std::string z = corpus("finding-libtorch-typeparser-null-read");
  REQUIRE(z.size() == original.size());
  CHECK(load_refusal(original).code == errc{});
  z.replace(z.size() - 22, 22, original.substr(original.size() - 22));
  ZipView v(z);
  check_refused(z, "entry 'archive/code/__torch__.py' does not match its checksum");
  const std::size_t code = v.entry("code/__torch__.py"), map = v.entry("__torch__.py.debug_pkl");
  v.fix_crc(code);
  check_refused(z, "entry 'archive/code/__torch__.py.debug_pkl': its data descriptor disagrees");
  v.fix_crc(map);
  check_refused(z, "record 'code/__torch__.py' line 5 is not an attribute of a type ampactor");
  z.replace(v.data(code), v.size(code), original.substr(v.data(code), v.size(code)));
  v.fix_crc(code);
  check_refused(z, "record 'code/__torch__.py.debug_pkl' is not the source map of a class");
}

TEST_CASE(
    "LibTorch's entries all have data descriptors and load, and one that disagrees is refused") {
  const std::string good = tensor_archive();
  std::string z = good;
  ZipView v(z);
  for (std::size_t i = 0; i < v.central.size(); ++i)
    CHECK((v.flags(i) & 8) != 0);  // general-purpose bit 3: CRC and sizes after the data
  CHECK(load_refusal(good).code == errc{});
  const std::size_t w = v.entry("data/0");
  SUBCASE("its CRC") {
    v.put(v.descriptor(w) + 4, v.le(v.descriptor(w) + 4, 4) ^ 1, 4);
  }
  SUBCASE("its size") {
    v.put(v.descriptor(w) + 8, v.size(w) - 4, 4);
  }
  SUBCASE("a CRC in the local header as well") {
    v.put(v.local(w) + 14, 1, 4);
  }
  const Refusal r = load_refusal(z);
  CHECK(r.code == errc::bad_checkpoint);
  CHECK_MESSAGE((r.mentions("entry 'archive/data/0': its data descriptor disagrees") ||
                 r.mentions("entry 'archive/data/0': its local header disagrees")),
                r.what);
}

TEST_CASE("A zip laid out by hand loads with data descriptors and without") {
  // Both layouts are the zip spec's; LibTorch's reader finds the same bytes in each.
  const auto records = ampactor::test::records_of(tensor_archive());
  for (bool descriptors : {true, false}) {
    CAPTURE(descriptors);
    const std::string z = ampactor::test::plain_zip(records, descriptors);
    torch::serialize::InputArchive a = ampactor::test::archive_of(z);
    torch::Tensor t;
    a.read("w", t);
    CHECK(torch::equal(t, torch::arange(77, torch::kFloat)));
  }
}

TEST_CASE("LibTorch 2.x's byteorder and serialization_id load as it writes them, and only so") {
  // LibTorch 2.x adds both records to every archive; 1.13 writes neither and ignores them.
  ampactor::test::Records base;
  for (auto& r : ampactor::test::records_of(scaler_archive()))
    if (r.first != "byteorder" && r.first != ".data/serialization_id") base.push_back(r);
  auto with = [&](const std::string& order, const std::string& id) {
    ampactor::test::Records r = base;
    r.emplace_back("byteorder", order);
    r.emplace_back(".data/serialization_id", id);
    return ampactor::test::plain_zip(r, true);
  };
  const std::string id(40, '7');
  CHECK(load_refusal(ampactor::test::plain_zip(base, true)).code == errc{});
  CHECK(load_refusal(with("little", "0053167805114163985304933824767093521420")).code == errc{});
  check_refused(with("big", id), "record 'byteorder' is not the 'little'");
  check_refused(with("little\n", id), "record 'byteorder' is not the 'little'");
  check_refused(with("little", id + "1"), "record '.data/serialization_id' is not the 40 digits");
  check_refused(with("little", std::string(39, '7') + "x"),
                "record '.data/serialization_id' is not the 40 digits");
}

TEST_CASE("The zip check refuses what LibTorch's reader could read otherwise than it checked") {
  struct Case {
    const char* what;
    std::function<void(ZipView&)> change;
    const char* says;
  };
  const Case cases[] = {
      {"an end record saying no entries, as the finding's",
       [](ZipView& v) { v.put(v.eocd + 8, 0, 2), v.put(v.eocd + 10, 0, 2); },
       "its zip64 and zip end records disagree"},
      {"an entry overlapping the one before it",
       [](ZipView& v) { v.put(v.central[1] + 42, v.local(0), 4); },
       "does not start where the entry before it ends"},
      {"a local header naming another entry", [](ZipView& v) { v.z[v.local(0) + 31] ^= 1; },
       "its local header disagrees with the directory"},
      {"two names miniz cannot tell apart",
       [](ZipView& v) {
         const std::size_t i = v.entry("data/1");  // "archive/DATA/0", as data/0 in upper case
         v.z.replace(v.central[i] + 46 + 8, 4, "DATA"), v.z.replace(v.local(i) + 30 + 8, 4, "DATA");
         v.z.replace(v.central[i] + 46 + 13, 1, "0"), v.z.replace(v.local(i) + 30 + 13, 1, "0");
       },
       "is there twice"},
      {"a directory, which miniz reads as empty",
       [](ZipView& v) { v.put(v.central[0] + 38, 0x10, 4); }, "not a file name LibTorch writes"},
      {"an entry compressed otherwise than by deflate",
       [](ZipView& v) { v.put(v.central[0] + 10, 12, 2), v.put(v.local(0) + 8, 12, 2); },
       "is compressed by a method LibTorch never uses"},
      {"an encrypted entry",
       [](ZipView& v) { v.put(v.central[0] + 8, 9, 2), v.put(v.local(0) + 6, 9, 2); },
       "flags LibTorch never sets"},
      {"an archive comment", [](ZipView& v) { v.put(v.eocd + 20, 1, 2), v.z += "x"; },
       "no zip directory at its end"},
      {"bytes hidden before the directory",
       [](ZipView& v) {
         const std::uint64_t dir = v.central[0], z64 = v.eocd - 76;
         v.put(z64 + 48, dir + 4, 8), v.put(v.eocd - 12, z64 + 4, 8),
             v.put(v.eocd + 16, dir + 4, 4);
         v.z.insert(dir, "junk");
       },
       "bytes between its last entry and its zip directory"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    std::string z = tensor_archive();
    ZipView v(z);
    c.change(v);
    check_refused(z, c.says);
    CHECK(!ampactor::test::zip_damage_of({z.begin(), z.end()}).empty());  // read_torch_state_dict's
  }
}

TEST_CASE(
    "A deflated code record is checked against its CRC once inflated, a deflated tensor refused") {
  // LibTorch deflates a class's code where that makes it smaller; the CRC is the inflated bytes'.
  torch::serialize::OutputArchive a;
  for (int i = 0; i < 30; ++i)
    a.write("attribute_" + std::to_string(i), c10::IValue(std::int64_t(i)));
  a.write("w", torch::ones({4}));
  std::string z = ampactor::test::bytes_of(a);
  ZipView v(z);
  const std::size_t code = v.entry("code/__torch__.py"), w = v.entry("data/0");
  REQUIRE(v.le(v.central[code] + 10, 2) == 8);
  CHECK(load_refusal(z).code == errc{});
  SUBCASE("its CRC") {
    v.put(v.central[code] + 16, v.le(v.central[code] + 16, 4) ^ 1, 4);
    v.put(v.descriptor(code) + 4, v.le(v.central[code] + 16, 4), 4);
    check_refused(z, "record 'code/__torch__.py' does not match its checksum");
  }
  SUBCASE("its deflated bytes") {
    v.z[v.data(code) + 20] ^= 0x55;
    const Refusal r = load_refusal(z);
    CHECK(r.code == errc::bad_checkpoint);
    CHECK_MESSAGE((r.mentions("record 'code/__torch__.py' does not match its checksum") ||
                   r.mentions("record 'archive/code/__torch__.py' does not inflate")),
                  r.what);
  }
  SUBCASE("a tensor's record deflated") {
    v.put(v.central[w] + 10, 8, 2), v.put(v.local(w) + 8, 8, 2);
    check_refused(z, "record 'data/0' is compressed, which LibTorch does to code alone");
  }
}

TEST_CASE("A pickle naming a GLOBAL ampactor never writes is refused, naming it") {
  const std::string base = scaler_archive();
  const std::string pkl = record_of(base, "data.pkl");
  check_refused(
      with_record(base, "data.pkl", patched(pkl, "c__torch__\nModule\n", "cos\nsystem\n")),
      "is not one ampactor writes: data.pkl: GLOBAL 'os.system', which ampactor's "
      "checkpoints never name (byte 2)");
  check_refused(
      with_record(base, "data.pkl",
                  patched(pkl, "c__torch__\nModule\n", "ctorch.jit._pickle\nrestore_type_tag\n")),
      "GLOBAL 'torch.jit._pickle.restore_type_tag'");
  check_refused(
      with_record(base, "data.pkl", patched(pkl, "c__torch__\nModule\n", "c__torch__\nOther\n")),
      "GLOBAL '__torch__.Other'");
}

TEST_CASE("data.pkl is refused, with the byte, where it is not what LibTorch's pickler writes") {
  const std::string base = tensor_archive();
  const std::string pkl = record_of(base, "data.pkl");
  const std::pair<std::string, const char*> cases[] = {
      {patched(pkl, "X\x04\x00\x00\x00step", "X\xff\xff\xff\x7fstep"),
       "the pickle ends inside an opcode"},
      {patched(pkl, "q\x00", "q\x07"), "a memo index out of order"},
      {patched(pkl, "M\xa5\x05", "\x88"), "a __torch__.Module's 'step' is not its declared int"},
      {patched(pkl, "(K\x4dt(K\x01t", "(K\x4et(K\x01t"), "a tensor that reaches past its storage"},
      {patched(pkl, "K\x4dtQ", "K\x4etQ"), "storage 0 of another size than its record"},
      {patched(pkl, "}", "]"), "pickle opcode 0x5d, which ampactor's checkpoints never hold"},
      {pkl + "x", "bytes after the pickle's end"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.second);
    check_refused(with_record(base, "data.pkl", c.first), std::string("data.pkl: ") + c.second);
    check_refused(with_record(base, "data.pkl", c.first), " (byte ");
  }
}

TEST_CASE("Code and records ampactor never writes are refused before LibTorch compiles them") {
  const std::string base = scaler_archive();
  const std::string code = record_of(base, "code/__torch__.py");
  const std::pair<std::string, const char*> cases[] = {
      {with_record(base, "code/__torch__.py", code + "  def forward(self) -> int:\n    return 1\n"),
       "record 'code/__torch__.py' line 9 is not an attribute of a type ampactor writes"},
      {with_record(base, "code/__torch__.py",
                   patched(code, "scale : float", "scale : List[float]")),
       "is not an attribute of a type ampactor writes"},
      {with_record(base, "code/__torch__.py", code + "  me : __torch__.Module\n"),
       "class __torch__.Module contains itself"},
      {with_record(base, "code/__torch__.py",
                   code + "  other : __torch__.___torch_mangle_9.Module\n"),
       "refers to __torch__.___torch_mangle_9.Module, whose code is missing"},
      {with_record(base, "code/__torch__.py", patched(code, "(Module)", "(object)")),
       "is not the code LibTorch writes for a module of attributes"},
      {with_record(base, "code/__torch__.py.debug_pkl", "\x80\x02N."),
       "record 'code/__torch__.py.debug_pkl' is not the source map"},
      {with_record(base, "constants.pkl", std::string("\x80\x02K\x01\x85.", 6)),
       "record 'constants.pkl' is not the empty table"},
      {with_record(base, "extra/notes.txt", "hello"), "record 'extra/notes.txt', which ampactor"},
      {with_record(base, "model.json", "{}"), "record 'model.json', which ampactor"},
      {with_record(base, "data/3", "1234"), "record 'data/3' is no tensor's storage"},
      {ampactor::test::without_record(base, "constants.pkl"), "no record 'constants.pkl'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.second);
    check_refused(c.first, c.second);
  }
  SUBCASE("an attribute LibTorch would print, but not read back as written") {
    torch::serialize::OutputArchive a;
    a.write("if", c10::IValue(1.0));
    check_refused(ampactor::test::bytes_of(a), "has an attribute named 'if'");
  }
}

// 100,000 attributes took 42 s of CPU when every name was compared with every other.
TEST_CASE("A code record of 100000 attributes is screened in linear time" * doctest::timeout(20)) {
  const std::string base = scaler_archive();
  std::string code = record_of(base, "code/__torch__.py");
  for (int i = 0; i < 100000; ++i)
    code += "  a" + std::to_string(i) + " : float\n";
  check_refused(with_record(base, "code/__torch__.py", code), "with 5 attributes, not 100005");
  check_refused(with_record(base, "code/__torch__.py", code + "  a7 : float\n"),
                "declares 'a7' twice");
}

TEST_CASE("Modules nested 64 deep load, 65 deep are refused") {
  const auto nested = [](int depth) {
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    std::vector<std::unique_ptr<torch::serialize::OutputArchive>> a;
    for (int i = 0; i < depth; ++i)
      a.push_back(std::make_unique<torch::serialize::OutputArchive>(cu));
    a.back()->write("leaf", c10::IValue(std::int64_t(1)));
    for (int i = depth - 1; i > 0; --i)
      a[i - 1]->write("inner", *a[i]);
    return ampactor::test::bytes_of(*a[0]);
  };
  CHECK(load_refusal(nested(64)).code == errc{});
  check_refused(nested(65), "modules nested deeper than ampactor's checkpoints nest");
}
