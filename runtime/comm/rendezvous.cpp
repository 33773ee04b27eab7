#include "runtime/comm/rendezvous.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

int read_int(const char* name, int fallback, bool required, int min) {
  const char* text = std::getenv(name);
  if (!text || !*text) {
    if (required)
      throw InputError("environment variable " + std::string(name) +
                       " is not set (lockstep worker needs RANK and WORLD_SIZE, as torchrun "
                       "sets them; or start ranks with `lockstep run`)");
    return fallback;
  }
  int value = 0;
  std::string s(text);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < min)
    throw InputError("environment variable " + std::string(name) + " = '" + s +
                     "' must be an integer >= " + std::to_string(min));
  return value;
}

}  // namespace


std::string host_name() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  return name;
}


TorchrunEnv TorchrunEnv::from_environment() {
  TorchrunEnv env;
  env.rank = read_int("RANK", 0, true, 0);
  env.world_size = read_int("WORLD_SIZE", 1, true, 1);
  env.local_rank = read_int("LOCAL_RANK", env.rank, false, 0);
  env.local_world_size = read_int("LOCAL_WORLD_SIZE", env.world_size, false, 1);
  env.master_port = read_int("MASTER_PORT", 29500, false, 1);
  if (env.master_port > 65535) throw InputError("environment variable MASTER_PORT must be <= 65535");
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) env.master_addr = addr;
  if (env.rank >= env.world_size)
    throw InputError("RANK = " + std::to_string(env.rank) + " is not below WORLD_SIZE = " +
                     std::to_string(env.world_size));
  if (env.local_rank >= env.local_world_size)
    throw InputError("LOCAL_RANK = " + std::to_string(env.local_rank) +
                     " is not below LOCAL_WORLD_SIZE = " + std::to_string(env.local_world_size));
  return env;
}

RendezvousResult SingleProcessRendezvous::join(std::chrono::milliseconds timeout) {
  RendezvousResult result;
  result.store_host = "127.0.0.1";
  result.store = open_tcp_store(result.store_host, 0, /*is_server=*/true, 1, timeout);
  result.store_port = store_port(result.store);
  result.description = "one process alone, its own TCPStore at 127.0.0.1:" + std::to_string(result.store_port);
  return result;
}

RendezvousResult TorchrunRendezvous::join(std::chrono::milliseconds timeout) {
  RendezvousResult result;
  result.rank = env_.rank;
  result.world_size = env_.world_size;
  result.local_rank = env_.local_rank;
  result.local_world_size = env_.local_world_size;
  result.store_host = env_.master_addr;
  result.store_port = env_.master_port;
  const bool host_store = env_.rank == 0;
  try {
    result.store = open_tcp_store(env_.master_addr, env_.master_port, host_store,
                                  env_.world_size, timeout);
  } catch (const std::exception& e) {
    throw RunError("rank " + std::to_string(env_.rank) + ": cannot " +
                   (host_store ? "host" : "reach") + " the rendezvous store at " +
                   env_.master_addr + ":" + std::to_string(env_.master_port) + " (" + e.what() +
                   ")");
  }
  result.description = "TCPStore at " + env_.master_addr + ":" +
                       std::to_string(env_.master_port) + ", hosted by rank 0";
  return result;
}

}  // namespace lockstep
