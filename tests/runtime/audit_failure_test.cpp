// An audit's all-gather that fails because a peer left is reported as a
// collective failure (CollectiveFailed), which a worker answers by waiting
// for the coordinator's verdict on the peers, not as the rank's own error:
// a lost worker then costs a restart under fault.max_restarts, whichever
// collective noticed it first. Real Gloo, ranks as threads.
#include "runtime/audit/audit.h"

#include <chrono>

#include <gtest/gtest.h>

#include "optim/optimizer.h"
#include "runtime/base/errors.h"
#include "runtime/comm/control_group.h"
#include "runtime/model/models.h"
#include "runtime/run/run_folder.h"
#include "support/shell.h"
#include "support/thread_world.h"

namespace lockstep {
namespace {

using std::chrono::seconds;

TEST(AuditFailure, AnAllGatherAPeerLeftIsACollectiveFailureNotTheRanksOwnError) {
  testing::TempDir dir;
  std::string message;
  bool collective = false, other = false;
  testing::run_ranks(2, [&](int rank, StorePtr store) {
    auto group = CollectiveGroup::gloo(prefixed("control/", store), rank, 2, seconds(5), {"127.0.0.1"});
    ControlGroup control(store, std::move(group), seconds(5));
    if (rank == 1) return;  // leaves: its group and its sockets go with it
    ModelSection section;
    section.name = "mlp";
    auto model = ModelRegistry::with_builtins().build(section);
    // The optimizer is only touched under audit.policy = resync: one flat segment will do.
    const auto flat = at::zeros({16});
    auto optimizer = optim::make_optimizer({{flat, at::zeros_like(flat)}}, optim::OptimizerSpec{});
    EventWriter evidence(dir.path() + "/audit-rank0.jsonl");
    Auditor auditor(AuditSection{}, control, *model, evidence);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 is gone
    try {
      auditor.start(1);
      auditor.finish(*optimizer);
    } catch (const CollectiveFailed& e) {
      collective = true;
      message = e.what();
    } catch (const std::exception& e) {
      other = true;
      message = e.what();
    }
  });
  EXPECT_TRUE(collective) << (other ? "another error: " : "no error: ") << message;
  EXPECT_NE(message.find("audit at step 1: the all-gather on the control group failed on rank 0"),
            std::string::npos) << message;
}

}  // namespace
}  // namespace lockstep
