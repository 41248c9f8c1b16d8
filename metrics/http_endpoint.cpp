#include "http_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ampactor::internal {

namespace {
std::string sys_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}
}  // namespace

HttpEndpoint::HttpEndpoint(const std::string& bind_address, std::function<std::string()> body)
    : body_(std::move(body)) {
  const std::size_t colon = bind_address.rfind(':');
  if (colon == std::string::npos || colon + 1 == bind_address.size())
    throw std::runtime_error("not host:port");
  std::string host = bind_address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);  // [::1]:9464
  const std::string port = bind_address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found))
    throw std::runtime_error(gai_strerror(rc));
  std::string error = "no address";
  for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = sys_error("socket");
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restart may rebind at once
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      error = sys_error("bind");
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw std::runtime_error(error);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

HttpEndpoint::~HttpEndpoint() {
  stop_ = true;
  thread_.join();  // the loop looks at stop_ at least every 100 ms
  close(listen_fd_);
}

void HttpEndpoint::serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    answer(fd);
    close(fd);
  }
}

void HttpEndpoint::answer(int fd) {
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;  // closed or timed out: nothing to answer
    request.append(buf, static_cast<std::size_t>(n));
  }
  const bool metrics =
      request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0;
  std::string content;
  std::string status = "404 Not Found";
  std::string type = "text/plain; charset=utf-8";
  if (metrics) {
    status = "200 OK";
    type = "text/plain; version=0.0.4; charset=utf-8";
    try {
      content = body_();
    } catch (const std::exception& e) {
      status = "500 Internal Server Error";
      content = e.what();
    }
  } else {
    content = "ampactor: the metrics are at /metrics\n";
  }
  const std::string head = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                           "\r\nContent-Length: " + std::to_string(content.size()) +
                           "\r\nConnection: close\r\n\r\n";
  const std::string out = head + content;
  for (std::size_t sent = 0; sent < out.size();) {
    const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

}  // namespace ampactor::internal
