#include "worker/coordinator_rendezvous.h"

#include <cstdlib>

#include "runtime/comm/process_group.h"
#include "worker/grpc_store.h"

namespace lockstep {

RendezvousResult CoordinatorRendezvous::join(std::chrono::milliseconds timeout) {
  RendezvousResult result;
  result.rank = reply_.rank();
  result.world_size = reply_.world_size();
  result.local_rank = reply_.local_rank();
  result.local_world_size = reply_.local_world_size();
  result.run_id = reply_.run_id();
  // Gloo's address follows the route to the coordinator, where the store is.
  const std::string& address = client_.address();
  result.store_host = client_.host();
  result.store_port = std::atoi(address.substr(address.rfind(':') + 1).c_str());
  // One store serves every generation of the job: each generation's keys
  // under their own prefix, so no rank reads an address a lost one left.
  result.store = prefixed("generation-" + std::to_string(reply_.generation()) + "/",
                          c10::make_intrusive<GrpcStore>(client_, reply_.run_id(), timeout));
  result.description = "the coordinator's store at " + address + " (over its gRPC channel), generation " +
                       std::to_string(reply_.generation());
  return result;
}

}  // namespace lockstep
