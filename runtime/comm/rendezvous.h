#pragma once
// How a rank finds the others. A Rendezvous hands back the rank's place in
// the job and the store every process group is built on. The torchrun way
// (environment variables, rank 0 hosts the store) is one implementation;
// the coordinator's is another. The trainer sees only RendezvousResult.
#include <chrono>
#include <string>

#include "runtime/comm/process_group.h"

namespace lockstep {

struct RendezvousResult {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  StorePtr store;            // shared by every rank of the job
  std::string store_host;    // where this rank reached the store (Gloo's address follows
  int store_port = 0;        // from the route there: runtime/comm/network.h)
  std::string run_id;        // "" = rank 0 chooses one
  std::string description;   // for the log: where the store is, who hosts it
};

// This machine's host name.
std::string host_name();

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Blocks until this rank has its place, at most `timeout`. Throws RunError.
  virtual RendezvousResult join(std::chrono::milliseconds timeout) = 0;
};

// torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT.
struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // Reads the process environment. Throws InputError naming the variable.
  static TorchrunEnv from_environment();
};

// Rank 0 hosts a TCPStore on MASTER_ADDR:MASTER_PORT; every other rank
// connects to it. Rank 0 chooses the run id.
class TorchrunRendezvous : public Rendezvous {
 public:
  explicit TorchrunRendezvous(TorchrunEnv env) : env_(std::move(env)) {}
  RendezvousResult join(std::chrono::milliseconds timeout) override;

 private:
  TorchrunEnv env_;
};

// One process alone (world size 1): it hosts its own store on
// 127.0.0.1, on a port the system picks. For a replay on this machine.
class SingleProcessRendezvous : public Rendezvous {
 public:
  RendezvousResult join(std::chrono::milliseconds timeout) override;
};

}  // namespace lockstep
