// The launcher's run: the store (rank 0's, or torchrun's agent's), gloo's device, a
// ProcessGroupGloo, and the Watch that names the ranks who fail.
#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include "watch.h"

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace ampactor::dist {

#define AMPACTOR_DIST_POSITIVE(T, name)                                          \
  DistOptions& DistOptions::name(T value) {                                      \
    if (value.count() <= 0)                                                      \
      throw ScalerError(errc::bad_option, "DistOptions::" #name " must be > 0"); \
    name##_ = value;                                                             \
    return *this;                                                                \
  }
AMPACTOR_DIST_POSITIVE(std::chrono::milliseconds, timeout)
AMPACTOR_DIST_POSITIVE(std::chrono::milliseconds, heartbeat)
#undef AMPACTOR_DIST_POSITIVE

DistOptions& DistOptions::bucket_bytes(std::int64_t value) {
  if (value <= 0) throw ScalerError(errc::bad_option, "DistOptions::bucket_bytes must be > 0");
  bucket_bytes_ = value;
  return *this;
}

namespace {

using detail::env;
using namespace std::string_literals;

bool loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(a);
    return IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr) && a6->sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

std::string numeric(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(a, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return host;
}

/// The first address `host` resolves to (empty if none) and whether every one is loopback.
std::string resolve(const std::string& host, bool* all_loopback) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  *all_loopback = false;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return {};
  std::string first = numeric(res->ai_addr, res->ai_addrlen);
  bool all = true;
  for (const addrinfo* r = res; r; r = r->ai_next)
    all = all && loopback(r->ai_addr);
  ::freeaddrinfo(res);
  *all_loopback = all;
  return first;
}

/// The local address the kernel would send from to reach `host` (a UDP connect sends nothing).
std::string route_to(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return {};
  std::string out;
  const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        !loopback(reinterpret_cast<sockaddr*>(&me)))
      out = numeric(reinterpret_cast<sockaddr*>(&me), len);
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

/// This host's address for ranks on other hosts where its name gives none: the one the default
/// route leaves from, else the only IPv4 address outside loopback that an interface has. Empty
/// where neither is found; `seen` then lists the candidates.
std::string outward_address(std::string& seen) {
  if (std::string via = route_to("192.0.2.1"); !via.empty()) return via;  // TEST-NET-1
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::vector<std::string> found;
  for (const ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !loopback(i->ifa_addr)) {
      found.push_back(numeric(i->ifa_addr, sizeof(sockaddr_in)));
      seen += std::string(seen.empty() ? "" : ", ") + found.back() + " (" + i->ifa_name + ")";
    }
  ::freeifaddrs(list);
  return found.size() == 1 ? found[0] : std::string();
}

/// Whether the interface `name` has an address and all of its addresses are loopback.
bool interface_is_loopback(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool any = false, all = true;
  for (const ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && name == i->ifa_name &&
        (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6))
      any = true, all = all && loopback(i->ifa_addr);
  ::freeifaddrs(list);
  return any && all;
}

/// A rank's messages start with it: "rank 3: ".
std::string rank_prefix(int rank) {
  return "rank " + std::to_string(rank) + ": ";
}

/// What device_for needs to know of MASTER_ADDR, read once: resolving it asks the resolver.
struct Master {
  std::string ip;         // the first address it resolves to, or ""
  bool local = false;     // every address it resolves to is loopback, or it is "localhost"
  bool one_host = false;  // every rank runs on this host, as far as the launch says
  std::string fix;        // what to do where gloo's device would be one other hosts cannot reach
};

Master master_of(const Launch& l) {
  Master m;
  m.ip = resolve(l.master_addr, &m.local);
  m.local = m.local || l.master_addr == "localhost";
  // Loopback serves only where every rank runs here: MASTER_ADDR may name this host (torchrun's
  // and Slurm's host names resolve to 127.0.1.1 on Debian) while others run elsewhere.
  // A loopback address written as such (or "localhost") no other host could reach; a local size
  // not said counts as every rank here, as before it was read.
  in6_addr numeric_addr{};
  const bool literal = l.master_addr == "localhost" ||
                       ::inet_pton(AF_INET, l.master_addr.c_str(), &numeric_addr) == 1 ||
                       ::inet_pton(AF_INET6, l.master_addr.c_str(), &numeric_addr) == 1;
  m.one_host = (m.local && literal) || l.world_size == 1 || l.local_world_size == 0 ||
               l.local_world_size == l.world_size;
  m.fix = "set GLOO_SOCKET_IFNAME to the interface that reaches " + l.master_addr +
          " (`ip route get " + (m.ip.empty() ? l.master_addr : m.ip) + "` names it)";
  return m;
}

/// gloo's device on the interface GLOO_SOCKET_IFNAME names. Refused (`refused` set) where that
/// interface is loopback while ranks run on other hosts: they could not reach this one there.
std::shared_ptr<::gloo::transport::Device> device_on(const char* ifname, const Launch& l,
                                                     const Master& m, std::string& refused) {
  if (!(m.local && m.one_host) && interface_is_loopback(ifname)) {
    refused = rank_prefix(l.rank) + "GLOO_SOCKET_IFNAME=" + ifname +
              " is a loopback interface, while " +
              (m.local ? "ranks run on other hosts ("s + std::to_string(l.local_world_size) +
                             " of " + std::to_string(l.world_size) + " here)"
                       : "MASTER_ADDR " + l.master_addr + " is not a loopback address") +
              ": ranks on other hosts could not reach this one; " + m.fix;
    return nullptr;
  }
  return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
}

/// gloo's device where this host's name resolves to loopback (Debian's /etc/hosts names the host
/// 127.0.1.1): the address that reaches the master instead, or, on the master's own host, the
/// address other hosts reach it at. Refused (`refused` set) where neither is found.
std::shared_ptr<::gloo::transport::Device> device_past_loopback_name(const Launch& l,
                                                                     const Master& m,
                                                                     const std::string& host,
                                                                     const std::string& host_ip,
                                                                     std::string& refused) {
  const std::string me = rank_prefix(l.rank);
  std::string seen;
  const std::string via = m.local ? outward_address(seen) : route_to(l.master_addr);
  if (via.empty() && m.local) {
    refused = me + "this host's name '" + host + "' resolves to " +
              (host_ip.empty() ? "no address" : host_ip + ", a loopback address") +
              ", as does MASTER_ADDR " + l.master_addr + ", while ranks run on other hosts (" +
              std::to_string(l.local_world_size) + " of " + std::to_string(l.world_size) +
              " here), and no default route or single address names this host to them (" +
              (seen.empty() ? "no address outside loopback" : seen) +
              "): set GLOO_SOCKET_IFNAME to the interface the other hosts reach";
    return nullptr;
  }
  if (via.empty()) {
    refused = me + "this host's name '" + host + "' resolves to " +
              (host_ip.empty() ? "no address" : host_ip + ", a loopback address") +
              " (as Debian's /etc/hosts sets it), and no route reaches MASTER_ADDR " +
              l.master_addr + "; gloo would tell the ranks on other hosts to reach this one " +
              "there: " + m.fix;
    return nullptr;
  }
  if (l.local_rank == 0)
    std::cerr << "ampactor::dist: " << me << "this host's name '" << host << "' resolves to "
              << (host_ip.empty() ? "no address" : host_ip + " (loopback)") << ", so gloo uses "
              << via
              << (m.local ? ", the address other hosts reach this one at (MASTER_ADDR "
                          : ", the address that reaches MASTER_ADDR ")
              << l.master_addr << (m.local ? " is this host)" : "")
              << " (GLOO_SOCKET_IFNAME chooses another)" << std::endl;
  return c10d::ProcessGroupGloo::createDeviceForHostname(via);
}

/// gloo's device, chosen as dist.h says. `refused` is set instead where the device would tell
/// the other hosts' ranks to reach this one on loopback.
std::shared_ptr<::gloo::transport::Device> device_for(const Launch& l, std::string& refused) {
  const Master m = master_of(l);
  if (const char* ifname = env("GLOO_SOCKET_IFNAME")) return device_on(ifname, l, m, refused);
  if (m.local && m.one_host) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  const std::string host = detail::host_name();
  bool host_local = false;
  const std::string host_ip = resolve(host, &host_local);
  if (!host_ip.empty() && !host_local) return c10d::ProcessGroupGloo::createDefaultDevice();
  return device_past_loopback_name(l, m, host, host_ip, refused);
}

/// Whether this rank is a client of torchrun's agent's store (dist.h).
bool agent_client() {
  if (const char* v = env("AMPACTOR_AGENT_STORE")) return std::string(v) != "0";
  return TORCH_VERSION_MAJOR >= 2;
}

/// The store's port: MASTER_PORT, or, where this LibTorch cannot be a client of torchrun's
/// agent's store, that of ampactor's own store beside it (said once).
int store_port(const Launch& launch, bool client) {
  if (!launch.agent_store || client) return launch.master_port;
  // This LibTorch cannot talk to torchrun's store (LibTorch 1.x beside a 2.x torchrun):
  // ampactor's own, beside it, chosen without a try.
  const char* p = env("AMPACTOR_STORE_PORT");
  const int port = p                            ? std::atoi(p)
                   : launch.master_port < 65535 ? launch.master_port + 1
                                                : launch.master_port - 1;
  if (port < 1 || port > 65535)
    throw ScalerError(errc::bad_option, std::string("ampactor::dist: AMPACTOR_STORE_PORT=") + p +
                                            " is not a port in [1, 65535]");
  if (launch.rank == 0)
    std::cerr << "ampactor::dist: torchrun's agent hosts the store at " << launch.master_addr << ":"
              << launch.master_port << ", whose protocol this LibTorch (" << TORCH_VERSION
              << ") does not speak; rank 0 hosts ampactor's own at " << launch.master_addr << ":"
              << port << " (AMPACTOR_STORE_PORT names another)" << std::endl;
  return port;
}

/// The run's store at `where` (MASTER_ADDR:`port`), hosted by rank 0 unless this rank is a client
/// of torchrun's agent's; under torchrun, its keys under this attempt's prefix.
c10::intrusive_ptr<c10d::Store> open_store(const Launch& launch, const DistOptions& options,
                                           int port, bool client, const std::string& where) {
  const std::string host = client ? "torchrun's agent" : "rank 0";
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    c10d::TCPStoreOptions so;
    so.port = std::uint16_t(port);
    so.isServer = !client && launch.rank == 0;
    // The ranks join through the Watch instead, which can name the ones that did not.
    so.waitWorkers = false;
    so.timeout = options.timeout();
    tcp = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, so);
  } catch (const std::exception& e) {
    throw ScalerError(errc::rank_failed, rank_prefix(launch.rank) + "the store at " + where +
                                             " cannot be reached (" + host +
                                             " hosts it): " + detail::brief(e));
  }
  // A restart under torchrun must never meet the last attempt's keys (gloo's addresses among
  // them) in a store that outlived it.
  if (launch.launcher == "torchrun")
    return c10::make_intrusive<c10d::PrefixStore>(
        "attempt/" + launch.run_id + "/" + std::to_string(launch.restart), tcp);
  return tcp;
}

/// The process group over gloo on `device`; the caller names what kept it from forming.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, const Launch& launch, const DistOptions& options,
    std::shared_ptr<::gloo::transport::Device> device) {
  auto go = c10d::ProcessGroupGloo::Options::create(options.timeout());
  go->devices.push_back(device);
  auto gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, launch.rank, launch.world_size, go);
#if TORCH_VERSION_MAJOR >= 2
  // LibTorch 2.x: gloo is a Backend that a ProcessGroup dispatches to, per device type (gloo
  // takes CUDA tensors too, where two ranks share one GPU and NCCL would refuse them).
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, launch.rank, launch.world_size);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  for (const auto type : {c10::DeviceType::CPU, c10::DeviceType::CUDA})
    pg->setBackend(type, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return pg;
#else
  return gloo;
#endif
}

World init_unreported(const Launch& launch, const DistOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() + options.timeout();
  if (launch.world_size < 1 || launch.rank < 0 || launch.rank >= launch.world_size)
    throw ScalerError(errc::bad_option, "ampactor::dist::init: rank " +
                                            std::to_string(launch.rank) + " of " +
                                            std::to_string(launch.world_size) + " ranks");
  World w;
  w.launch = launch;
  const bool client = launch.agent_store && agent_client();
  const int port = store_port(launch, client);
  const std::string where = launch.master_addr + ":" + std::to_string(port);
  w.store = open_store(launch, options, port, client, where);
  // Beating from here: a rank that dies while the group forms is named like one that dies later.
  auto watch = std::make_unique<detail::Watch>(w.store, launch.rank, launch.world_size, options);
  watch->hosted_by(where, !client);
  std::string refused;
  auto device = device_for(launch, refused);
  watch->join(deadline, refused);
  try {
    w.pg = gloo_group(w.store, launch, options, std::move(device));
  } catch (const std::exception& e) {
    throw ScalerError(errc::rank_failed,
                      rank_prefix(launch.rank) + "the process group (gloo, store at " + where +
                          ") did not form: " + watch->diagnose(detail::brief(e)));
  }
  w.ranks = detail::over_watched(w.pg, w.store, launch.rank, launch.world_size, options,
                                 std::move(watch));
  return w;
}

/// torchrun sets OMP_NUM_THREADS=1 for several workers a node unless the user set it: said once.
void say_threads(const Launch& l) {
  const char* omp = env("OMP_NUM_THREADS");
  if (l.launcher != "torchrun" || l.rank != 0 || l.local_world_size < 2 || !omp ||
      std::string(omp) != "1")
    return;
  std::cerr << "ampactor::dist: OMP_NUM_THREADS=1 (torchrun's default for " << l.local_world_size
            << " workers a node): LibTorch's ops, the optimizer thread and the fused steps run "
               "on one thread each, unless OMP_NUM_THREADS, "
               "AsyncOptimizerOptions::optimizer_threads or FusedOptions::threads say more"
            << std::endl;
}

}  // namespace

World init_from_env(const DistOptions& options) {
  try {
    const Launch l = launch_from_env();
    say_threads(l);
    return init(l, options);
  } catch (const std::exception& e) {
    report_failure(e.what());
    throw;
  }
}

World init(const Launch& launch, const DistOptions& options) {
  try {
    return init_unreported(launch, options);
  } catch (const std::exception& e) {
    report_failure(e.what());
    throw;
  }
}

}  // namespace ampactor::dist
