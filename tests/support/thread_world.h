#pragma once
// Runs N ranks as threads of this test process over a real TCPStore
// (a free port) and real Gloo groups. Each thread gets its rank and a client
// store; an exception in any thread fails the test with its message.
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/process_group.h"

namespace lockstep::testing {

inline void run_ranks(int world, const std::function<void(int, StorePtr)>& body) {
  using std::chrono::seconds;
  StorePtr server = open_tcp_store("127.0.0.1", 0, true, world, seconds(30));
  const int port = store_port(server);
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank, open_tcp_store("127.0.0.1", port, false, world, seconds(30)));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(rank) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace lockstep::testing
