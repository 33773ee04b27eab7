// Choosing Gloo's address and a rank's threads: the rules that make the
// multi-host path work, on this host's real interfaces.
#include "runtime/comm/network.h"

#include <gtest/gtest.h>

#include "runtime/job/config.h"
#include "runtime/base/errors.h"
#include "runtime/precision/machine.h"

namespace lockstep {
namespace {

std::string error_of(const GlooAddressRequest& request) {
  try {
    choose_gloo_addresses(request);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(GlooAddress, LoopbackStoreMeansLoopback) {
  auto choice = choose_gloo_addresses({"", "", "127.0.0.1", 29500});
  EXPECT_EQ(choice.addresses, std::vector<std::string>{"127.0.0.1"});
  EXPECT_NE(choice.reason.find("on loopback"), std::string::npos) << choice.reason;
  EXPECT_EQ(choose_gloo_addresses({"", "", "localhost", 29500}).value, "127.0.0.1");
}

TEST(GlooAddress, InterfaceByNameOrAddress) {
  auto choice = choose_gloo_addresses({"lo", "", "127.0.0.1", 1});
  EXPECT_EQ(choice.value, "127.0.0.1");
  EXPECT_NE(choice.reason.find("comm.interface = lo"), std::string::npos) << choice.reason;
  // GLOO_SOCKET_IFNAME is this host's own setting: it wins over the job's.
  choice = choose_gloo_addresses({"nosuch0", "lo", "127.0.0.1", 1});
  EXPECT_NE(choice.reason.find("GLOO_SOCKET_IFNAME = lo"), std::string::npos) << choice.reason;
  EXPECT_NE(choice.reason.find("over comm.interface = nosuch0"), std::string::npos) << choice.reason;
}

TEST(GlooAddress, WhatThisHostLacksIsBadInputListingWhatItHas) {
  const std::string unknown = error_of({"nosuch0", "", "127.0.0.1", 1});
  EXPECT_NE(unknown.find("comm.interface names 'nosuch0'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("lo (127.0.0.1)"), std::string::npos) << unknown;
  const std::string foreign = error_of({"", "192.0.2.7", "127.0.0.1", 1});
  EXPECT_NE(foreign.find("GLOO_SOCKET_IFNAME names '192.0.2.7'"), std::string::npos) << foreign;
}

TEST(GlooAddress, LoopbackWhileTheStoreIsElsewhereIsRefused) {
  // A documentation address (TEST-NET-1): nothing is sent to it.
  const std::string e = error_of({"lo", "", "192.0.2.1", 29500});
  EXPECT_NE(e.find("binds Gloo to loopback"), std::string::npos) << e;
  EXPECT_NE(e.find("192.0.2.1:29500"), std::string::npos) << e;
}

TEST(ThreadsPerRank, DerivedFromAffinityQuotaAndOmpNumThreads) {
  JobConfig config;
  std::string why;
  bool over = false;
  CpuBudget budget;
  budget.online = 8;
  budget.affinity = 8;
  EXPECT_EQ(threads_per_rank(config, budget, 2, &why, &over), 4);
  budget.affinity = 1;  // taskset -c 0
  EXPECT_EQ(threads_per_rank(config, budget, 1, &why, &over), 1);
  EXPECT_NE(why.find("1 of 8 CPUs in this process's affinity"), std::string::npos) << why;
  budget.affinity = 8;
  budget.quota = 2.5;  // a Kubernetes limit of 2500m
  EXPECT_EQ(threads_per_rank(config, budget, 1, &why, &over), 2);
  EXPECT_NE(why.find("cgroup quota 2.5 CPUs"), std::string::npos) << why;
  budget.quota = 0;
  budget.omp_num_threads = 3;
  EXPECT_EQ(threads_per_rank(config, budget, 1, &why, &over), 3);
  EXPECT_NE(why.find("capped by OMP_NUM_THREADS = 3"), std::string::npos) << why;
  EXPECT_FALSE(over);
}

TEST(ThreadsPerRank, TheKeyWinsAndOversubscriptionIsSaid) {
  JobConfig config;
  config.job.threads_per_rank = 4;
  CpuBudget budget;
  budget.online = budget.affinity = 2;
  std::string why;
  bool over = false;
  EXPECT_EQ(threads_per_rank(config, budget, 1, &why, &over), 4);
  EXPECT_TRUE(over);
  EXPECT_NE(why.find("threads will wait on each other"), std::string::npos) << why;
  config.job.threads_per_rank = 1;
  EXPECT_EQ(threads_per_rank(config, budget, 2, &why, &over), 1);
  EXPECT_FALSE(over);
}

}  // namespace
}  // namespace lockstep
