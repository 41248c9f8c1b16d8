// A minimal HTTP/1.x server for one page: GET /metrics answers with what `body` returns (the
// Prometheus text format), anything else 404. One thread of its own (the default stack),
// connections served one at a time with a timeout, so a stuck scraper cannot stall it for long.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace ampactor::internal {

class HttpEndpoint {
 public:
  /// Listens on "host:port" (port 0: a free one). std::runtime_error if it cannot.
  HttpEndpoint(const std::string& bind_address, std::function<std::string()> body);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;
  int port() const { return port_; }

 private:
  void serve();
  void answer(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::function<std::string()> body_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ampactor::internal
