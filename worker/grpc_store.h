#pragma once
// A c10d::Store whose keys live in the coordinator (its Store call): every
// operation travels on the worker's authenticated gRPC channel, so the job
// needs no store port of its own and nobody without the token reaches the
// keys. Blocking operations (get, wait) give up after the store's timeout
// (setTimeout; Gloo's connect passes its own) with an error naming the keys
// and the coordinator; every other call is bounded by the same timeout.
// Thread-safe as the client is. The client must outlive the store.
#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

namespace lockstep {

class CoordinatorClient;

class GrpcStore : public c10d::Store {
 public:
  GrpcStore(CoordinatorClient& client, std::string run_id, std::chrono::milliseconds timeout);
#if TORCH_VERSION_MAJOR >= 2
  // Another handle on the same keys (LibTorch 2.x asks for one per thread
  // that uses the store); it shares the client, which is thread-safe.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  CoordinatorClient& client_;
  const std::string run_id_;
};

}  // namespace lockstep
