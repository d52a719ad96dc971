#include "comm/world.h"

#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>

#include "comm/gloo_communicator.h"
#include "comm/local_communicator.h"
#include "comm/nccl_communicator.h"

namespace mt::comm {

World::World(const DistEnv& env, std::chrono::milliseconds timeout, DeviceComm dev)
    : env_(env), timeout_(timeout), dev_(dev) {
#ifndef MT_HAVE_NCCL
  if (dev_.nccl) throw Error("this build has no NCCL backend (built without CUDA): GPU ranks cannot communicate");
#endif
  if (env_.world_size == 1) {
    world_ = std::make_shared<LocalCommunicator>("world", 0);
    return;
  }
  // A peer that dies closes its sockets; Gloo's next write to one would raise SIGPIPE and kill
  // this rank silently instead of failing the operation with an error that names the lost rank.
  std::signal(SIGPIPE, SIG_IGN);
  if (env_.store_secret.empty())
    fail("{} ranks from the {}, but {} is not set: export the same random value for every rank (e.g. {}=$(openssl "
         "rand -hex 16)), or start the ranks with 'megatron launch', which sets it",
         env_.world_size, env_.source, kStoreSecretEnv, kStoreSecretEnv);
  // Listen on the master address only (loopback for a local job): the ranks reach the store
  // there, and nothing else should.
  if (env_.rank == 0 && !env_.store_hosted)
    server_ = std::make_unique<TcpStoreServer>(env_.master_addr, env_.master_port, env_.store_secret);
  store_ = std::make_shared<TcpStore>(env_.master_addr, env_.master_port, timeout_, env_.store_secret, env_.rank);
  gloo::transport::tcp::attr attr;
  // Listen on the interface that routes to the master, which the other ranks can reach too;
  // GLOO_SOCKET_IFNAME (PyTorch's variable) picks an interface explicitly.
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) attr.iface = ifname;
  else attr.hostname = local_address_towards(env_.master_addr);
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("cannot open a Gloo TCP device ({}); set GLOO_SOCKET_IFNAME to a network interface",
                                e.what()));
  }
  std::vector<int> all(static_cast<size_t>(env_.world_size));
  for (int i = 0; i < env_.world_size; ++i) all[static_cast<size_t>(i)] = i;
  world_ = new_group("world", all);
}

World::~World() {
  world_.reset();
  device_.reset();
}

CommPtr World::new_group(const std::string& name, const std::vector<int>& ranks) {
  auto it = std::find(ranks.begin(), ranks.end(), env_.rank);
  MT_CHECK(it != ranks.end(), "rank {} is not a member of group '{}'", env_.rank, name);
  const int my = static_cast<int>(it - ranks.begin());
  if (ranks.size() == 1) return std::make_shared<LocalCommunicator>(name, env_.rank);
  // One store namespace per group instance: the member list makes names of different
  // instances (tp of ranks 0,1 vs tp of ranks 2,3) distinct.
  std::string key = "pg/" + name + "/" + fmt::format("{}", fmt::join(ranks, ","));
  auto store = std::make_shared<PrefixStore>(key, store_);
  CommPtr host = std::make_shared<GlooCommunicator>(name, ranks, my, store, device_, timeout_);
#ifdef MT_HAVE_NCCL
  if (dev_.nccl)
    return std::make_shared<NcclCommunicator>(name, ranks, my, std::make_shared<PrefixStore>("nccl", store), host,
                                              dev_.compute_stream, dev_.device, timeout_);
#endif
  return host;
}

void World::shutdown() {
  if (!store_) return;
  // Everyone finishes before anyone leaves: world rank 0 may host the store the others still use.
  store_barrier(*store_, "shutdown", env_.world_size);
  if (auto* tcp = dynamic_cast<TcpStore*>(store_.get())) tcp->goodbye();
}

}  // namespace mt::comm
