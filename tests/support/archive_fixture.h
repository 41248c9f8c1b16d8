// LibTorch archives through memory, for the checkpoint tests.
#pragma once

#include <ampactor/checkpoint/checkpoint.h>

#include <torch/serialize.h>

#include <sstream>
#include <string>

namespace ampactor::test {

/// The bytes `out` would write to a file.
inline std::string bytes_of(torch::serialize::OutputArchive& out) {
  std::ostringstream s;
  out.save_to(s);
  return s.str();
}

/// `bytes` read back as an archive, through load_checkpoint's checks.
inline torch::serialize::InputArchive archive_of(const std::string& bytes) {
  torch::serialize::InputArchive in;
  load_checkpoint(in, bytes.data(), bytes.size(), "test archive");
  return in;
}

/// A state_dict written into an archive and read back: what a scaler's load() is given.
inline torch::serialize::InputArchive state_dict_archive(const StateDict& sd) {
  torch::serialize::OutputArchive out;
  write_state_dict(sd, out);
  return archive_of(bytes_of(out));
}

}  // namespace ampactor::test
