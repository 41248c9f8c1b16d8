// torchrun's conventions: the environment, a TCPStore hosted by rank 0, a ProcessGroupGloo.
#include <ampactor/core/errors.h>
#include <ampactor/distributed/dist.h>

#include "watch.h"

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <limits>

namespace ampactor::dist {
namespace {

/// An integer environment variable in [lo, hi]; `fallback` when unset (nullptr: required).
int env_int(const char* name, int lo, int hi, const int* fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback) return *fallback;
    throw ScalerError(errc::bad_option, std::string("ampactor::dist: ") + name +
                                            " is not set (launch with ampactor-launch or "
                                            "torchrun, or set RANK and WORLD_SIZE)");
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw ScalerError(errc::bad_option, std::string("ampactor::dist: ") + name + "=" + v +
                                            " is not an integer in [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + "]");
  return int(x);
}

bool loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

Launch launch_from_env() {
  Launch l;
  const int max = std::numeric_limits<int>::max();
  l.world_size = env_int("WORLD_SIZE", 1, 1 << 20, nullptr);
  l.rank = env_int("RANK", 0, l.world_size - 1, nullptr);
  l.local_rank = env_int("LOCAL_RANK", 0, max, &l.rank);
  const int default_port = l.master_port;
  l.master_port = env_int("MASTER_PORT", 1, 65535, &default_port);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) l.master_addr = a;
  return l;
}

World init_from_env(const DistOptions& options) {
  return init(launch_from_env(), options);
}

World init(const Launch& launch, const DistOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() + options.timeout();
  if (launch.world_size < 1 || launch.rank < 0 || launch.rank >= launch.world_size)
    throw ScalerError(errc::bad_option, "ampactor::dist::init: rank " +
                                            std::to_string(launch.rank) + " of " +
                                            std::to_string(launch.world_size) + " ranks");
  World w;
  w.launch = launch;
  const std::string where = launch.master_addr + ":" + std::to_string(launch.master_port);
  const std::string me = "rank " + std::to_string(launch.rank) + ": ";
  try {
    c10d::TCPStoreOptions so;
    so.port = std::uint16_t(launch.master_port);
    so.isServer = launch.rank == 0;
    // The ranks join through the Watch instead, which can name the ones that did not.
    so.waitWorkers = false;
    so.timeout = options.timeout();
    w.store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, so);
  } catch (const std::exception& e) {
    throw ScalerError(
        errc::rank_failed,
        me + "the store at " + where + " cannot be reached (rank 0 hosts it): " + detail::brief(e));
  }
  // Beating from here: a rank that dies while the group forms is named like one that dies later.
  auto watch = std::make_unique<detail::Watch>(w.store, launch.rank, launch.world_size, options);
  watch->join(deadline);
  try {
    auto go = c10d::ProcessGroupGloo::Options::create(options.timeout());
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (loopback(launch.master_addr))
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto gloo =
        c10::make_intrusive<c10d::ProcessGroupGloo>(w.store, launch.rank, launch.world_size, go);
#if TORCH_VERSION_MAJOR >= 2
    // LibTorch 2.x: gloo is a Backend that a ProcessGroup dispatches to, per device type (gloo
    // takes CUDA tensors too, where two ranks share one GPU and NCCL would refuse them).
    w.pg = c10::make_intrusive<c10d::ProcessGroup>(w.store, launch.rank, launch.world_size);
    w.pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    for (const auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA})
      w.pg->setBackend(device, c10d::ProcessGroup::BackendType::GLOO, gloo);
#else
    w.pg = std::move(gloo);
#endif
  } catch (const std::exception& e) {
    throw ScalerError(errc::rank_failed,
                      me + "the process group (gloo, store at " + where +
                          ") did not form: " + watch->diagnose(detail::brief(e)));
  }
  w.ranks = detail::over_watched(w.pg, w.store, launch.rank, launch.world_size, options,
                                 std::move(watch));
  return w;
}

}  // namespace ampactor::dist
