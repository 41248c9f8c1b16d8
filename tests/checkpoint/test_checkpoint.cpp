// Checkpoint files: the thread-free scaler in LibTorch's archives, atomic writes, damaged files
// refused with nothing changed, and GradScaler state_dicts written by PyTorch itself.
#include "doctest_torch.h"

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <torch/serialize.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "archive_fixture.h"
#include "checkpoint_fixture.h"
#include "file_size_limit.h"
#include "refusal.h"
#include "zip_fixture.h"

using namespace ampactor;
using ampactor::test::FileSizeLimit;
using ampactor::test::read_bytes;
using ampactor::test::TempDir;
using ampactor::test::write_bytes;

namespace {

LocalGradScaler scaler_with(double scale, std::int64_t tracker) {
  LocalGradScaler s(
      GradScalerOptions().init_scale(1024).growth_factor(3).backoff_factor(0.25).growth_interval(
          7));
  StateDict sd = s.state_dict();
  sd.set("scale", scale);
  sd.set("_growth_tracker", tracker);
  s.load_state_dict(sd);
  return s;
}

/// An archive with a tensor and a value, and the bytes torch writes for it.
std::vector<char> sample_archive() {
  torch::serialize::OutputArchive a;
  a.write("w", torch::arange(1000, torch::kFloat));
  a.write("scale", c10::IValue(65536.0));
  const std::string s = ampactor::test::bytes_of(a);
  return {s.begin(), s.end()};
}

bool holds_sample(torch::serialize::InputArchive& a) {
  torch::Tensor w;
  c10::IValue scale;
  a.read("w", w);
  a.read("scale", scale);
  return torch::equal(w, torch::arange(1000, torch::kFloat)) && scale.toDouble() == 65536.0;
}

using ampactor::test::code_of;

}  // namespace

TEST_CASE("LocalGradScaler: torch::save and torch::load give back its state_dict") {
  TempDir dir;
  const LocalGradScaler a = scaler_with(96.0, 5);
  torch::save(a, dir / "scaler.pt");
  LocalGradScaler b;
  torch::load(b, dir / "scaler.pt");
  CHECK(b.state_dict() == a.state_dict());
  CHECK(b.get_growth_factor() == 3.0);
  CHECK(b.get_growth_tracker() == 5);
}

TEST_CASE("LocalGradScaler::load: a bad or missing value is refused and changes nothing") {
  const LocalGradScaler good = scaler_with(96.0, 5);
  SUBCASE("a negative scale") {
    StateDict sd = good.state_dict();
    sd.set("scale", -1.0);
    torch::serialize::InputArchive in = ampactor::test::state_dict_archive(sd);
    LocalGradScaler s = scaler_with(96.0, 5);
    CHECK(code_of([&] { s.load(in); }) == errc::bad_state_dict);
    CHECK(s.state_dict() == good.state_dict());
  }
  SUBCASE("a missing key is named") {
    StateDict sd = good.state_dict();
    sd.erase("_growth_tracker");
    torch::serialize::InputArchive in = ampactor::test::state_dict_archive(sd);
    LocalGradScaler s = scaler_with(96.0, 5);
    CHECK_THROWS_WITH_AS(s.load(in), doctest::Contains("'_growth_tracker'"), ScalerError);
    CHECK(s.state_dict() == good.state_dict());
  }
}

TEST_CASE(
    "A disabled LocalGradScaler saves nothing, which an enabled one refuses with torch's "
    "text") {
  TempDir dir;
  torch::save(LocalGradScaler(GradScalerOptions().enabled(false)), dir / "off.pt");
  LocalGradScaler s = scaler_with(96.0, 5);
  const StateDict before = s.state_dict();
  CHECK_THROWS_WITH_AS(torch::load(s, dir / "off.pt"), texts::empty_state_dict, ScalerError);
  CHECK(s.state_dict() == before);
}

TEST_CASE("load_checkpoint: a missing file is refused by name") {
  TempDir dir;
  torch::serialize::InputArchive a;
  CHECK_THROWS_WITH_AS(load_checkpoint(a, dir / "nothing.pt"),
                       doctest::Contains("nothing.pt' cannot be opened: No such file"),
                       ScalerError);
}

TEST_CASE("load_checkpoint: every truncation is refused, and the archive keeps what it held") {
  TempDir dir;
  const std::vector<char> whole = sample_archive();
  write_bytes(dir / "good.pt", whole);
  torch::serialize::InputArchive a;
  load_checkpoint(a, dir / "good.pt");
  int refused = 0, cuts = 0;
  for (std::size_t cut = 0; cut < whole.size(); cut += 7, ++cuts) {
    write_bytes(dir / "cut.pt", {whole.begin(), whole.begin() + std::ptrdiff_t(cut)});
    refused += code_of([&] { load_checkpoint(a, dir / "cut.pt"); }) == errc::bad_checkpoint;
  }
  CHECK(refused == cuts);
  CHECK(holds_sample(a));
}

TEST_CASE("load_checkpoint: a flipped byte is refused or harmless, never a silently wrong value") {
  // LibTorch does not check the zip entries' CRCs; load_checkpoint does. A flip in a field no
  // reader uses (a local header's copy of the name or CRC) is harmless: the values load intact.
  TempDir dir;
  const std::vector<char> whole = sample_archive();
  int refused = 0, intact = 0, wrong = 0;
  for (std::size_t at = 0; at < whole.size(); at += 3) {
    std::vector<char> bad = whole;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    write_bytes(dir / "bad.pt", bad);
    torch::serialize::InputArchive a;
    try {
      load_checkpoint(a, dir / "bad.pt");
      (holds_sample(a) ? intact : wrong) += 1;
    } catch (const ScalerError& e) {
      refused += e.code() == errc::bad_checkpoint;
    } catch (const std::exception&) {
      wrong += 1;  // LibTorch's own error from a read: not the clear one promised
    }
  }
  CHECK(wrong == 0);
  CHECK(refused > 0);
  MESSAGE(refused << " flips refused, " << intact << " harmless");
}

TEST_CASE("The CRC check reads zip64 archives") {
  // LibTorch writes zip64 records for archives beyond 4 GiB; a small one built by hand here.
  CHECK(internal::crc32("123456789", 9) == 0xCBF43926u);  // the check value of CRC-32/ISO-HDLC
  const std::vector<char> zip = ampactor::test::zip64_archive("a/data/0", "hello, world");
  CHECK(ampactor::test::zip_damage_of(zip).empty());
  std::vector<char> bad = zip;
  bad.at(ampactor::test::zip64_data_offset("a/data/0") + 3) ^= 1;
  CHECK(ampactor::test::zip_damage_of(bad).find("does not match its checksum") !=
        std::string::npos);
}

TEST_CASE("save_atomically: an unwritable path is refused by name, the old file stays") {
  TempDir dir;
  const std::vector<char> old = sample_archive();
  write_bytes(dir / "ckpt.pt", old);
  torch::serialize::OutputArchive a;
  a.write("x", c10::IValue(1.0));
  CHECK_THROWS_WITH_AS(save_atomically(a, dir / "no-such-dir/ckpt.pt"),
                       doctest::Contains("no-such-dir/ckpt.pt.tmp."), ScalerError);
  ::mkdir((dir / "ckpt-dir").c_str(), 0755);  // rename over a directory fails
  CHECK(code_of([&] { save_atomically(a, dir / "ckpt-dir"); }) == errc::bad_checkpoint);
  CHECK(read_bytes(dir / "ckpt.pt") == old);
  CHECK(ampactor::test::list_dir(dir) == std::vector<std::string>{"ckpt-dir", "ckpt.pt"});
}

TEST_CASE("save_atomically and write_torch_state_dict on a full disk: refused, nothing left") {
  TempDir dir;
  const std::vector<char> old = sample_archive();
  write_bytes(dir / "ckpt.pt", old);
  torch::serialize::OutputArchive a;
  a.write("w", torch::arange(100000, torch::kFloat));  // 400 kB: beyond the limit below
  LocalGradScaler scaler;
  {
    FileSizeLimit limit(64 << 10);
    // It threw from inside LibTorch's zip writer, which terminated the process (SIGABRT).
    const std::string says = "cannot write checkpoint file '" + dir / "ckpt.pt.tmp.";
    CHECK_THROWS_WITH_AS(save_atomically(a, dir / "ckpt.pt"), doctest::Contains(says.c_str()),
                         ScalerError);
    CHECK_THROWS_WITH_AS(save_atomically(a, dir / "ckpt.pt"),
                         doctest::Contains("': File too large"), ScalerError);
  }
  CHECK(read_bytes(dir / "ckpt.pt") == old);  // the old checkpoint stays, no temporary is left
  CHECK(ampactor::test::list_dir(dir) == std::vector<std::string>{"ckpt.pt"});
  {
    FileSizeLimit limit(100);  // the state_dict's file is about 1 kB
    CHECK(code_of([&] { write_torch_state_dict(scaler.state_dict(), dir / "sd.pt"); }) ==
          errc::bad_checkpoint);
  }
  CHECK(ampactor::test::list_dir(dir) == std::vector<std::string>{"ckpt.pt"});
}

TEST_CASE("save_atomically writes what load_checkpoint reads") {
  TempDir dir;
  torch::serialize::OutputArchive out;
  out.write("w", torch::arange(1000, torch::kFloat));
  out.write("scale", c10::IValue(65536.0));
  save_atomically(out, dir / "ckpt.pt");
  torch::serialize::InputArchive in;
  load_checkpoint(in, dir / "ckpt.pt");
  CHECK(holds_sample(in));
}

// ---- PyTorch's own files (tests/fixtures/torch/make_fixtures.py) ----

TEST_CASE("read_torch_state_dict reads what torch.save(scaler.state_dict()) wrote") {
  const nlohmann::json expected =
      nlohmann::json::parse(std::ifstream(std::string(AMPACTOR_TORCH_FIXTURES) + "/expected.json"));
  for (const char* name : {"trained", "custom"}) {
    CAPTURE(name);
    const StateDict sd =
        read_torch_state_dict(std::string(AMPACTOR_TORCH_FIXTURES) + "/" + name + ".pt");
    const nlohmann::json& want = expected.at(name);
    CHECK(sd.size() == want.size());
    for (const auto& item : want.items()) {
      const std::string key = item.key();  // a structured binding cannot be captured (C++17)
      const nlohmann::json& value = item.value();
      CAPTURE(key);
      REQUIRE(sd.contains(key));
      if (value.is_number_float())
        CHECK(std::get<double>(sd.at(key)) == value.get<double>());
      else
        CHECK(std::get<std::int64_t>(sd.at(key)) == value.get<std::int64_t>());
    }
    LocalGradScaler s;
    s.load_state_dict(sd);
    CHECK(s.get_scale() == want.at("scale").get<double>());
    CHECK(s.get_growth_tracker() == want.at("_growth_tracker").get<std::int64_t>());
    CHECK(s.get_growth_interval() == want.at("growth_interval").get<std::int64_t>());
  }
}

TEST_CASE("A disabled PyTorch scaler's file gives torch's empty-state_dict error on load") {
  const StateDict sd = read_torch_state_dict(std::string(AMPACTOR_TORCH_FIXTURES) + "/disabled.pt");
  CHECK(sd.empty());
  LocalGradScaler s;
  CHECK_THROWS_WITH_AS(s.load_state_dict(sd), texts::empty_state_dict, ScalerError);
}

TEST_CASE("write_torch_state_dict writes the file PyTorch was checked to load") {
  // ampactor_written.pt was written by this function and loaded by torch.load +
  // GradScaler.load_state_dict (make_fixtures.py --check): the bytes must not drift from it.
  TempDir dir;
  const nlohmann::json want = nlohmann::json::parse(
      std::ifstream(std::string(AMPACTOR_TORCH_FIXTURES) + "/ampactor_written.json"));
  const LocalGradScaler s =
      scaler_with(want.at("scale").get<double>(), want.at("_growth_tracker").get<std::int64_t>());
  write_torch_state_dict(s.state_dict(), dir / "written.pt");
  if (std::getenv("AMPACTOR_REGENERATE_FIXTURES"))  // then: make_fixtures.py --check
    write_torch_state_dict(s.state_dict(),
                           std::string(AMPACTOR_TORCH_FIXTURES) + "/ampactor_written.pt");
  const std::string fixture = std::string(AMPACTOR_TORCH_FIXTURES) + "/ampactor_written.pt";
  if (TORCH_VERSION_MAJOR < 2) {
    CHECK(read_bytes(dir / "written.pt") == read_bytes(fixture));
  } else {
    // LibTorch 2.x's writer adds a byte order and a random serialization id to every file; the
    // records PyTorch was checked to load must not drift.
    auto records = [](const std::string& path) {
      const std::vector<char> b = read_bytes(path);
      ampactor::test::Records out;
      for (auto& r : ampactor::test::records_of(std::string(b.begin(), b.end())))
        if (r.first != ".data/serialization_id" && r.first != "byteorder") out.push_back(r);
      return out;
    };
    CHECK(records(dir / "written.pt") == records(fixture));
  }
  CHECK(read_torch_state_dict(dir / "written.pt") == s.state_dict());
}

TEST_CASE("read_torch_state_dict refuses files that hold no state_dict") {
  TempDir dir;
  const std::vector<char> list = torch::pickle_save(c10::IValue(std::vector<double>{1, 2}));
  write_bytes(dir / "list.pt", list);
  CHECK_THROWS_WITH_AS(read_torch_state_dict(dir / "list.pt"),
                       doctest::Contains("not a GradScaler state_dict"), ScalerError);
  write_bytes(dir / "junk.pt", std::vector<char>(100, 'x'));
  CHECK(code_of([&] { read_torch_state_dict(dir / "junk.pt"); }) == errc::bad_checkpoint);
}
