// Benchmark: what carrying the rendezvous store over the coordinator's
// authenticated gRPC channel costs at start-up, against c10d's TCPStore
// (unauthenticated, which the coordinator used to host). For world sizes
// 2, 4 and 8 (ranks as threads in this process, on loopback) it times
// building the two Gloo process groups a worker builds (control and data:
// every rank's address through the store, then the full mesh), and the
// round trip of one set + get. The two stores alternate within each
// repetition; the figure is the median over repetitions with min and max,
// and the ratio is taken within each repetition.
// Prints JSON on stdout. Usage: store_startup [repetitions=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "bench/bench_figures.h"
#include "coordinator/coordinator.h"
#include "runtime/comm/process_group.h"
#include "worker/coordinator_client.h"
#include "worker/grpc_store.h"

using namespace lockstep;
using nlohmann::json;
using lockstep::bench::cpu_model;
using lockstep::bench::summary;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kToken = "bench-token-0123456789abcdef0123";
constexpr std::chrono::milliseconds kTimeout{30000};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Timing {
  double groups_s = 0;     // the slowest rank's two process groups
  double round_trip_us = 0;  // one set + get, rank 0, median of 200
};

// Every rank builds both groups on `store_for(rank)`; then rank 0 times set+get.
template <typename StoreFor>
Timing measure(int world, StoreFor store_for) {
  std::vector<double> per_rank(static_cast<size_t>(world), 0.0);
  std::vector<std::thread> ranks;
  std::vector<StorePtr> stores(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) stores[size_t(r)] = store_for(r);
  const auto start = Clock::now();
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto control = CollectiveGroup::gloo(prefixed("control/", stores[size_t(r)]), r, world, kTimeout,
                                           {"127.0.0.1"});
      auto data = CollectiveGroup::gloo(prefixed("data/", stores[size_t(r)]), r, world, kTimeout,
                                        {"127.0.0.1"});
      per_rank[size_t(r)] = seconds_since(start);
    });
  for (auto& t : ranks) t.join();
  Timing timing;
  timing.groups_s = *std::max_element(per_rank.begin(), per_rank.end());
  std::vector<double> trips;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    stores[0]->set("trip/" + std::to_string(i), std::vector<uint8_t>{1, 2, 3});
    stores[0]->get("trip/" + std::to_string(i));
    trips.push_back(seconds_since(t0) * 1e6);
  }
  std::sort(trips.begin(), trips.end());
  timing.round_trip_us = trips[trips.size() / 2];
  return timing;
}

Timing with_tcp_store(int world) {
  StorePtr server = open_tcp_store("127.0.0.1", 0, true, world, kTimeout);
  const int port = store_port(server);
  return measure(world, [&](int rank) {
    return rank == 0 ? server : open_tcp_store("127.0.0.1", port, false, world, kTimeout);
  });
}

Timing with_grpc_store(int world) {
  CoordinatorOptions options;
  options.listen = "127.0.0.1:0";
  options.token = kToken;
  JobStateOptions job;
  job.run_id = "bench";
  job.world_size = world;
  CoordinatorServer server(options, job);
  server.start();
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int r = 0; r < world; ++r)
    clients.push_back(std::make_unique<CoordinatorClient>(
        ClientOptions{"127.0.0.1:" + std::to_string(server.port()), kToken, ""}));
  Timing timing = measure(world, [&](int rank) -> StorePtr {
    return c10::make_intrusive<GrpcStore>(*clients[size_t(rank)], "bench", kTimeout);
  });
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  spdlog::set_level(spdlog::level::warn);
  json out = {{"benchmark", "store_startup"},
              {"setup", {{"cpu", cpu_model()}, {"cores", std::thread::hardware_concurrency()},
                         {"repetitions", repetitions}, {"transport", "loopback, ranks as threads"},
                         {"measured", "both Gloo process groups of every rank (slowest rank); "
                                      "one set+get round trip (rank 0, median of 200)"}}}};
  for (int world : {2, 4, 8}) {
    std::vector<double> tcp_s, grpc_s, ratio, tcp_us, grpc_us;
    for (int rep = 0; rep < repetitions; ++rep) {
      // Alternate which goes first, so neither always meets a warm machine.
      Timing a, b;
      if (rep % 2 == 0) {
        a = with_tcp_store(world);
        b = with_grpc_store(world);
      } else {
        b = with_grpc_store(world);
        a = with_tcp_store(world);
      }
      tcp_s.push_back(a.groups_s);
      grpc_s.push_back(b.groups_s);
      ratio.push_back(b.groups_s / a.groups_s);
      tcp_us.push_back(a.round_trip_us);
      grpc_us.push_back(b.round_trip_us);
    }
    out["worlds"].push_back({{"world_size", world},
                             {"groups_s", {{"tcpstore", summary(tcp_s)}, {"grpc_store", summary(grpc_s)}}},
                             {"grpc_over_tcp_ratio", summary(ratio)},
                             {"set_get_round_trip_us",
                              {{"tcpstore", summary(tcp_us)}, {"grpc_store", summary(grpc_us)}}}});
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
