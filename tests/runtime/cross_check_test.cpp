// The arithmetic checks' pieces without processes: the rotation that
// decides who recomputes whose microbatch, the digest of one microbatch,
// and the step evidence written, read back and compared by a replay.
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/audit/cross_check.h"
#include "runtime/audit/step_evidence.h"
#include "support/shell.h"

namespace lockstep {
namespace {

TEST(CheckRotation, EveryRankIsCheckedAtEveryCheckByAnotherAndEachOfItsMicrobatchesInTurn) {
  for (int world : {2, 3, 4, 8}) {
    const CheckRotation rotation{world, 3};
    std::set<std::pair<int, int>> pairs;  // (checker, owner) over the checks
    for (int64_t c = 1; c <= 3 * world; ++c) {
      std::set<int> owners;
      for (int checker = 0; checker < world; ++checker) {
        const int owner = rotation.owner_checked_by(checker, c);
        EXPECT_NE(owner, checker) << "world " << world << " check " << c;
        owners.insert(owner);
        pairs.insert({checker, owner});
        const int64_t j = rotation.microbatch_of(owner, c);
        EXPECT_GE(j, owner * 3);
        EXPECT_LT(j, owner * 3 + 3);
      }
      EXPECT_EQ(int(owners.size()), world) << "every rank checked at check " << c;
    }
    // The checker rotates: over W - 1 checks every other rank checks each rank.
    EXPECT_EQ(int(pairs.size()), world * (world - 1)) << "world " << world;
    std::set<int64_t> indices;
    for (int64_t c = 0; c < 3; ++c) indices.insert(rotation.microbatch_of(1, c));
    EXPECT_EQ(indices, (std::set<int64_t>{3, 4, 5}));
  }
}

TEST(MicrobatchDigest, OneFlippedBitOrAnotherLossChangesTheDigestAndEqualBitsKeepIt) {
  torch::manual_seed(3);
  std::vector<at::Tensor> gradients = {torch::randn({64, 32}), torch::randn({32})};
  const MicrobatchDigest a = digest_microbatch(5, 2, gradients, 12.5, 16);
  EXPECT_EQ(a.combined(), digest_microbatch(5, 2, {gradients[0].clone(), gradients[1].clone()}, 12.5, 16).combined());
  EXPECT_EQ(a.combined().size(), 16u);
  at::Tensor flipped = gradients[0].clone();
  flipped.view(-1).narrow(0, 0, 1).view(at::kInt).bitwise_xor_(1);
  EXPECT_NE(a.combined(), digest_microbatch(5, 2, {flipped, gradients[1]}, 12.5, 16).combined());
  EXPECT_NE(a.combined(), digest_microbatch(5, 2, gradients, 12.500001, 16).combined());
  EXPECT_NE(a.combined(), digest_microbatch(5, 2, gradients, 12.5, 15).combined());
}

TEST(StepEvidence, WrittenReadBackAndReplayedItNamesTheFirstDifferenceByStepMicrobatchAndRank) {
  testing::TempDir dir;
  torch::manual_seed(4);
  std::vector<std::vector<at::Tensor>> grads;  // [step][microbatch]
  for (int s = 0; s < 3; ++s) grads.push_back({torch::randn({8}), torch::randn({8})});
  for (int rank = 0; rank < 2; ++rank) {
    EventWriter out(dir.path() + "/" + step_evidence_file(1, rank));
    EvidenceRecorder recorder(out, {rank, 2, 1, "host" + std::to_string(rank), 1});
    recorder.on_checkpoint(0);
    for (int s = 0; s < 3; ++s) {
      recorder.on_microbatch(digest_microbatch(s + 1, rank, {grads[size_t(s)][size_t(rank)]}, 1.0, 4));
      recorder.on_step_end(s + 1, rank == 0 ? StateDigest{"00ff" + std::to_string(s), "ab"} : StateDigest{});
    }
  }
  const RunEvidence evidence = read_run_evidence(dir.path());
  ASSERT_EQ(evidence.steps.size(), 3u);
  EXPECT_EQ(evidence.steps.at(2).size(), 2u);
  EXPECT_EQ(evidence.steps.at(2)[1].host, "host1");
  EXPECT_EQ(evidence.steps.at(2)[1].threads, 1);

  ReplayCheck same(evidence, 1, 3);
  for (int s = 0; s < 3; ++s) {
    for (int j = 0; j < 2; ++j) same.on_microbatch(digest_microbatch(s + 1, j, {grads[size_t(s)][size_t(j)]}, 1.0, 4));
    same.on_step_end(s + 1, StateDigest{"00ff" + std::to_string(s), "ab"});
  }
  EXPECT_EQ(same.steps_checked(), 3);
  EXPECT_EQ(same.microbatches_checked(), 6);
  EXPECT_EQ(same.states_checked(), 6);  // parameters and buffers

  ReplayCheck other(evidence, 1, 3);
  other.on_microbatch(digest_microbatch(1, 0, {grads[0][0]}, 1.0, 4));
  try {
    other.on_microbatch(digest_microbatch(1, 1, {grads[0][1] * 2}, 1.0, 4));
    FAIL() << "a different gradient was accepted";
  } catch (const ReplayMismatch& e) {
    EXPECT_EQ(e.step, 1);
    EXPECT_EQ(e.microbatch, 1);
    EXPECT_EQ(e.rank, 1);
    EXPECT_NE(std::string(e.what()).find("rank 1 (host1, generation 1 on 2 ranks)"), std::string::npos) << e.what();
  }
  ReplayCheck state(evidence, 2, 3);
  state.on_microbatch(digest_microbatch(1, 1, {grads[0][1] * 2}, 1.0, 4));  // before the range: not compared
  EXPECT_THROW(state.on_step_end(2, StateDigest{"0000", "ab"}), ReplayMismatch);
  // Buffers tied to the run's world size are left out; parameters still count.
  ReplayCheck no_buffers(evidence, 1, 3, /*buffers=*/false);
  EXPECT_NO_THROW(no_buffers.on_step_end(1, StateDigest{"00ff0", "cd"}));
  EXPECT_THROW(no_buffers.on_step_end(2, StateDigest{"0000", "ab"}), ReplayMismatch);
}

// Step evidence is read from outside: random changes to a valid file are
// read or refused as InputError, never a crash, a hang or another error.
TEST(StepEvidence, RandomlyDamagedEvidenceIsReadOrRefusedAsBadInput) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/" + step_evidence_file(1, 0);
  {
    EventWriter out(path);
    EvidenceRecorder recorder(out, {0, 2, 1, "host0", 1});
    for (int s = 1; s <= 3; ++s) {
      recorder.on_microbatch(digest_microbatch(s, 0, {torch::ones({4}) * s}, 1.0, 4));
      recorder.on_step_end(s, StateDigest{"00ff", "ab"});
    }
  }
  std::ifstream in(path);
  const std::string valid((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 random(7);
  const std::string bytes = "{}[]\":,0123456789-.eE\n\\ azAZ\x01\xff";
  int read = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text = valid;
    const int changes = 1 + int(random() % 4);
    for (int c = 0; c < changes; ++c) {
      const size_t at = random() % text.size();
      switch (random() % 3) {
        case 0: text[at] = bytes[random() % bytes.size()]; break;
        case 1: text.erase(at, 1 + random() % 8); break;
        default: text.insert(at, std::string(1 + random() % 3, bytes[random() % bytes.size()]));
      }
      if (text.empty()) text = "x";
    }
    std::ofstream(path, std::ios::trunc) << text;
    try {
      read_run_evidence(dir.path());
      ++read;
    } catch (const InputError&) {
      ++refused;
    }
  }
  EXPECT_EQ(read + refused, 3000);
  EXPECT_GT(refused, 100);
  // What the first run of this test found: a number beyond a double was an
  // uncaught parser exception, not bad input.
  std::ofstream(path, std::ios::trunc) << R"({"event":"step_evidence","step":1e999})" << "\n";
  EXPECT_THROW(read_run_evidence(dir.path()), InputError);
}

}  // namespace
}  // namespace lockstep
