// TensorBoardMetrics: TFRecord framing (length, its CRC, the event, its CRC) of protobuf Events.
#include <ampactor/metrics/tensorboard.h>

#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <ampactor/core/errors.h>

#include "tensorboard_event.pb.h"

namespace ampactor {

std::uint32_t tfrecord_masked_crc(const void* data, std::size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;  // CRC-32C
  crc.process_bytes(data, n);
  const std::uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

struct TensorBoardMetrics::File {
  std::string path;
  std::FILE* f = nullptr;
  std::string error;

  void record(const tensorboard::Event& e) {
    if (!f || !error.empty()) return;
    const std::string data = e.SerializeAsString();
    std::string out;
    put_le(out, data.size(), 8);
    const std::uint32_t len_crc = tfrecord_masked_crc(out.data(), 8);
    put_le(out, len_crc, 4);
    out += data;
    put_le(out, tfrecord_masked_crc(data.data(), data.size()), 4);
    if (std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fflush(f) != 0)
      error = path + ": write failed: " + std::strerror(errno);
  }
};

TensorBoardMetrics::TensorBoardMetrics(const std::string& dir) : f_(std::make_unique<File>()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw ScalerError(errc::bad_option,
                      "TensorBoardMetrics: cannot create " + dir + ": " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  f_->path = (std::filesystem::path(dir) /
              ("events.out.tfevents." + std::to_string(static_cast<long long>(now())) + "." + host +
               "." + std::to_string(getpid()) + ".ampactor"))
                 .string();
  f_->f = std::fopen(f_->path.c_str(), "wb");
  if (!f_->f)
    throw ScalerError(errc::bad_option, "TensorBoardMetrics: cannot create " + f_->path + ": " +
                                            std::strerror(errno));
  tensorboard::Event version;
  version.set_wall_time(now());
  version.set_file_version("brain.Event:2");
  f_->record(version);
}

TensorBoardMetrics::~TensorBoardMetrics() {
  close();
}

void TensorBoardMetrics::write(const IterationMetrics& m) {
  tensorboard::Event e;
  e.set_wall_time(m.wall_time);
  e.set_step(m.k);
  tensorboard::Summary& s = *e.mutable_summary();
  auto add = [&](const char* tag, double v) {
    if (std::isnan(v)) return;  // not measured: no point rather than a false one
    tensorboard::SummaryValue& value = *s.add_value();
    value.set_tag(tag);
    value.set_simple_value(static_cast<float>(v));
  };
  add("loss-scale", m.scale);
  add("grad-norm", m.grad_norm);
  add("iteration-time", m.iteration_s);
  add("Train/Samples/elapsed_time_ms_step", m.optimizer_step_s * 1e3);
  add("ampactor/scale-used", m.scale_used);
  add("ampactor/skipped", m.skipped);
  add("ampactor/found-inf", m.found_inf);
  add("ampactor/growth-tracker", static_cast<double>(m.growth_tracker));
  add("ampactor/backoffs-in-row", static_cast<double>(m.backoffs_in_row));
  add("ampactor/collapsing", m.collapsing);
  add("ampactor/overflow-tensors", static_cast<double>(m.overflow.size()));
  add("ampactor/found-by-ranks", static_cast<double>(m.found_by.size()));
  add("ampactor/trainer-wait-ms", m.trainer_wait_s * 1e3);
  f_->record(e);
}

void TensorBoardMetrics::close() {
  if (f_->f && std::fclose(f_->f) != 0 && f_->error.empty())
    f_->error = f_->path + ": close failed: " + std::strerror(errno);
  f_->f = nullptr;
}

std::string TensorBoardMetrics::failure() const {
  return f_->error;
}

const std::string& TensorBoardMetrics::path() const {
  return f_->path;
}

}  // namespace ampactor
