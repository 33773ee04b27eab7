#pragma once
// The coordinator's rendezvous, apart from the client so that code which
// only talks to the coordinator (status, the tests' clusters) stays free of
// torch and c10d.
#include <chrono>

#include "lockstep/proto/lockstep.pb.h"
#include "runtime/comm/rendezvous.h"
#include "worker/coordinator_client.h"

namespace lockstep {

// A rank placed by the coordinator: the store is the coordinator's, reached
// through `client` (which must outlive the result's store).
class CoordinatorRendezvous : public Rendezvous {
 public:
  CoordinatorRendezvous(v1::JoinReply reply, CoordinatorClient& client)
      : reply_(std::move(reply)), client_(client) {}
  RendezvousResult join(std::chrono::milliseconds timeout) override;

 private:
  v1::JoinReply reply_;
  CoordinatorClient& client_;
};

}  // namespace lockstep
