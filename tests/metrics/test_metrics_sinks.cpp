// The TensorBoard and Prometheus sinks: the event file read back record by record (framing,
// both checksums, the protobuf Events), and the endpoint fetched over HTTP.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <ampactor/metrics/metrics.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "metrics_run.h"
#include "skip.h"

#ifdef AMPACTOR_TENSORBOARD
#include <ampactor/metrics/tensorboard.h>

#include "tensorboard_event.pb.h"
#endif
#ifdef AMPACTOR_PROMETHEUS
#include <ampactor/metrics/prometheus.h>
#endif

using namespace ampactor;

namespace {

[[maybe_unused]] std::uint64_t le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

/// GET http://127.0.0.1:port<path>, with a 10 s timeout on every socket call.
[[maybe_unused]] std::string http_get(int port, const std::string& path = "/metrics") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;)
    out.append(buf, n);
  close(fd);
  return out;
}

[[maybe_unused]] double series(const std::string& body, const std::string& name) {
  const std::regex re("\\n" + name + "\\{job_name=\"ampactor\"\\} ([^\\n]+)");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(body, m, re), name << " not in\n" << body);
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("tensorboard: the checksum is CRC-32C, masked as TFRecord masks it") {
#ifdef AMPACTOR_TENSORBOARD
  // CRC-32C's check value: "123456789" -> 0xe3069283; masked: ((c >> 15 | c << 17) + 0xa282ead8).
  CHECK(tfrecord_masked_crc("123456789", 9) == 0xc78ab0e5u);
#else
  AMPACTOR_SKIP("the TensorBoard sink is not built (no protobuf or Boost)");
#endif
}

TEST_CASE("tensorboard: the event file holds every record's values, each record's CRCs intact") {
#ifdef AMPACTOR_TENSORBOARD
  const auto dir = std::filesystem::temp_directory_path() / "ampactor-metrics-tb";
  std::filesystem::remove_all(dir);
  auto metrics = std::make_shared<Metrics>();
  auto mem = std::make_shared<MemoryMetrics>();
  auto tb = std::make_shared<TensorBoardMetrics>(dir.string());
  metrics->sink(tb).sink(mem);
  test::metrics_run(9, /*staleness=*/0, metrics, metrics);
  REQUIRE(mem->records.size() == 9);
  CHECK(std::filesystem::path(tb->path()).filename().string().rfind("events.out.tfevents.", 0) ==
        0);
  std::ifstream f(tb->path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<tensorboard::Event> events;
  for (std::size_t at = 0; at < bytes.size();) {
    REQUIRE(at + 12 <= bytes.size());
    const std::uint64_t len = le(bytes, at, 8);
    CHECK(le(bytes, at + 8, 4) == tfrecord_masked_crc(bytes.data() + at, 8));
    REQUIRE(at + 16 + len <= bytes.size());
    CHECK(le(bytes, at + 12 + len, 4) == tfrecord_masked_crc(bytes.data() + at + 12, len));
    tensorboard::Event e;
    REQUIRE(e.ParseFromArray(bytes.data() + at + 12, static_cast<int>(len)));
    events.push_back(e);
    at += 16 + len;
  }
  REQUIRE(events.size() == 10);
  CHECK(events[0].file_version() == "brain.Event:2");
  for (std::size_t i = 0; i < mem->records.size(); ++i) {
    const IterationMetrics& r = mem->records[i];
    const tensorboard::Event& e = events[i + 1];
    CAPTURE(r.k);
    CHECK(e.step() == r.k);
    CHECK(e.wall_time() == r.wall_time);
    std::map<std::string, float> v;
    for (const auto& value : e.summary().value())
      v[value.tag()] = value.simple_value();
    CHECK(v.at("loss-scale") == r.scale);
    CHECK(v.at("ampactor/scale-used") == r.scale_used);
    CHECK(v.at("ampactor/skipped") == float(r.skipped));
    CHECK(v.at("ampactor/growth-tracker") == float(r.growth_tracker));
    CHECK(v.at("ampactor/backoffs-in-row") == float(r.backoffs_in_row));
    CHECK(v.at("ampactor/overflow-tensors") == float(r.overflow.size()));
    CHECK(v.at("Train/Samples/elapsed_time_ms_step") == float(r.optimizer_step_s * 1e3));
    CHECK(v.at("ampactor/trainer-wait-ms") == float(r.trainer_wait_s * 1e3));
    if (r.skipped)
      CHECK(v.count("grad-norm") == 0);  // not measured: no point
    else
      CHECK(v.at("grad-norm") == float(r.grad_norm));
  }
  std::filesystem::remove_all(dir);
#else
  AMPACTOR_SKIP("the TensorBoard sink is not built (no protobuf or Boost)");
#endif
}

TEST_CASE("prometheus: the endpoint's counters advance with the iterations") {
#ifdef AMPACTOR_PROMETHEUS
  auto prom = std::make_shared<PrometheusMetrics>("127.0.0.1:0");
  REQUIRE(prom->port() > 0);
  auto metrics = std::make_shared<Metrics>();
  metrics->sink(prom);
  KeeperCore core(GradScalerOptions().init_scale(1024).growth_interval(2), ScalePolicy::exact,
                  metrics);
  auto iterate = [&](iteration_t k, bool inf) {
    core.handle(1, ScaleRequest{k}, 1);
    UnscaleDone d;
    d.k = k;
    d.found_inf = d.local_found_inf = inf;
    d.scale_used = core.state().scale();
    core.handle(2, d);
    core.handle(1, UpdateScale{k, 1});
  };
  iterate(0, false);
  iterate(1, true);
  std::string body = http_get(prom->port());
  CHECK(body.rfind("HTTP/1.", 0) == 0);
  CHECK(series(body, "ampactor_iterations_total") == 2);
  CHECK(series(body, "ampactor_skipped_steps_total") == 1);
  CHECK(series(body, "ampactor_loss_scale") == 512);
  for (iteration_t k = 2; k < 5; ++k)
    iterate(k, false);
  body = http_get(prom->port());
  CHECK(series(body, "ampactor_iterations_total") == 5);
  CHECK(series(body, "ampactor_skipped_steps_total") == 1);
  CHECK(series(body, "ampactor_iteration") == 4);
  CHECK(series(body, "ampactor_growth_tracker") == 1);
  CHECK(series(body, "ampactor_loss_scale") == 1024);
#else
  AMPACTOR_SKIP("the Prometheus sink is not built (no prometheus-cpp)");
#endif
}

TEST_CASE("prometheus: the endpoint serves /metrics in the text format, other paths 404") {
#ifdef AMPACTOR_PROMETHEUS
  PrometheusMetrics prom("127.0.0.1:0");
  const std::string ok = http_get(prom.port());
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(ok.find("# TYPE ampactor_iterations_total counter") != std::string::npos);
  CHECK(series(ok, "ampactor_iterations_total") == 0);
  const std::string missing = http_get(prom.port(), "/other");
  CHECK(missing.rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
#else
  AMPACTOR_SKIP("the Prometheus sink is not built (no prometheus-cpp)");
#endif
}

TEST_CASE("prometheus: a port in use is refused with the address") {
#ifdef AMPACTOR_PROMETHEUS
  PrometheusMetrics first("127.0.0.1:0");
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_AS(PrometheusMetrics second(taken), ScalerError);
  try {
    PrometheusMetrics again(taken);
  } catch (const ScalerError& e) {
    CHECK(std::string(e.what()).find("PrometheusMetrics: cannot serve on " + taken) !=
          std::string::npos);
  }
#else
  AMPACTOR_SKIP("the Prometheus sink is not built (no prometheus-cpp)");
#endif
}
