// DecisionLog's held printing: each decision once, with the ranks it holds
// for; a rank's own line only where it differs; nothing lost on failure.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "runtime/run/decisions.h"

namespace lockstep {
namespace {

// Captures what spdlog's default logger prints while it lives.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out_);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// Rank r's log of the same three kinds of decision.
void record_rank(DecisionLog& log, int rank) {
  log.record("device", "cpu", "no CUDA");
  log.record("train_seed", std::to_string(1 + rank), "seed + rank");
  log.record("gloo_address", rank == 1 ? "10.0.0.2" : "10.0.0.1", "the route to the store");
}

TEST(Decisions, EachIsPrintedOnceWithItsRanksAndARankOnlyWhereItDiffers) {
  std::vector<std::string> held;  // what each rank hands to the exchange
  {
    CapturedLog unused;  // these logs print their held lines as they go
    for (int rank = 0; rank < 3; ++rank) {
      DecisionLog log;
      log.hold();
      record_rank(log, rank);
      held.push_back(log.held_json());
    }
  }
  std::string printed[3];
  for (int rank = 0; rank < 3; ++rank) {
    CapturedLog capture;
    DecisionLog log;
    log.hold();
    record_rank(log, rank);
    EXPECT_EQ(capture.text(), "") << "held back until the exchange";
    log.print_held(rank, held);
    printed[rank] = capture.text();
  }
  EXPECT_EQ(printed[0],
            "Decision: device = cpu (no CUDA) [all 3 ranks]\n"
            "Decision: train_seed = 1 (seed + rank) [rank 0]\n"
            "Decision: gloo_address = 10.0.0.1 (the route to the store) [ranks 0, 2]\n");
  EXPECT_EQ(printed[1],
            "Decision: train_seed = 2 (seed + rank) [rank 1]\n"
            "Decision: gloo_address = 10.0.0.2 (the route to the store) [rank 1]\n");
  EXPECT_EQ(printed[2], "Decision: train_seed = 3 (seed + rank) [rank 2]\n");
}

TEST(Decisions, HeldDecisionsAreNotLostWhenTheRankFailsBeforeTheExchange) {
  CapturedLog capture;
  {
    DecisionLog log;
    log.hold();
    log.record("device", "cpu", "no CUDA");
    log.record("audit", "off", "audit.every = 0", true);
    EXPECT_EQ(capture.text(), "");
  }  // unwound before print_held, as when rendezvous throws
  EXPECT_EQ(capture.text(), "Decision: device = cpu (no CUDA)\nDecision: audit = off (audit.every = 0)\n");
}

TEST(Decisions, AfterTheExchangeDecisionsPrintAtOnceAndAllAreKept) {
  CapturedLog capture;
  DecisionLog log;
  log.hold();
  log.record("device", "cpu", "no CUDA");
  log.print_held(0, {log.held_json()});
  log.record("grad_scaler_skipped", "2 of 12 steps", "too many", true);
  EXPECT_EQ(capture.text(), "Decision: device = cpu (no CUDA)\nDecision: grad_scaler_skipped = 2 of 12 steps (too many)\n");
  EXPECT_EQ(log.all().size(), 2u);
  EXPECT_EQ(log.to_json().size(), 2u);
}

}  // namespace
}  // namespace lockstep
