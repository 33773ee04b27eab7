#include "runtime/checkpoint/checkpoint_store.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "runtime/base/errors.h"
#include "support/shell.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

using TempFolder = testing::TempDir;

void write_checkpoint(const CheckpointStore& store, int64_t step, int keep = 5) {
  store.write_file(step, "shared.bin", "parameters of step " + std::to_string(step));
  store.write_file(step, "rng-rank0.bin", "generator 0");
  store.write_file(step, "rng-rank1.bin", "generator 1");
  store.seal(step, {{"epoch", step / 10}}, keep);
}

void overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CheckpointStore, NewestCompleteCheckpointAndItsFilesComeBack) {
  TempFolder tmp;
  CheckpointStore store(tmp.path() + "/checkpoints");
  EXPECT_FALSE(store.newest_valid(nullptr).has_value());
  write_checkpoint(store, 10);
  write_checkpoint(store, 20);
  std::vector<std::string> rejected;
  auto found = store.newest_valid(&rejected);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 20);
  EXPECT_EQ(found->meta["epoch"], 2);
  EXPECT_TRUE(rejected.empty());
  EXPECT_EQ(store.read_file(*found, "shared.bin"), "parameters of step 20");
  EXPECT_THROW(store.read_file(*found, "absent.bin"), RunError);
}

// Bytes flipped or a file truncated: refused naming the file and why, and
// the next older complete checkpoint is used.
TEST(CheckpointStore, CorruptedOrTruncatedNewestIsRefusedNamingTheFile) {
  TempFolder tmp;
  CheckpointStore store(tmp.path() + "/checkpoints");
  write_checkpoint(store, 10);
  write_checkpoint(store, 20);
  write_checkpoint(store, 30);
  overwrite(store.step_folder(30) + "/shared.bin", "parameters of step 3X");  // same size
  overwrite(store.step_folder(20) + "/rng-rank1.bin", "gener");               // truncated
  std::vector<std::string> rejected;
  auto found = store.newest_valid(&rejected);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 10);
  ASSERT_EQ(rejected.size(), 2u);
  EXPECT_NE(rejected[0].find("step-000000030/shared.bin: checksum"), std::string::npos) << rejected[0];
  EXPECT_NE(rejected[1].find("step-000000020/rng-rank1.bin: 5 bytes, the index says 11"),
            std::string::npos) << rejected[1];
  // None valid: nothing found, every one named.
  overwrite(store.step_folder(10) + "/shared.bin", "");
  rejected.clear();
  EXPECT_FALSE(store.newest_valid(&rejected).has_value());
  EXPECT_EQ(rejected.size(), 3u);
}

// A writer killed before the index (files present, temp files lying around,
// no index.json) never leaves a checkpoint that counts as complete.
TEST(CheckpointStore, CheckpointWithoutIndexNeverLoadsAsComplete) {
  TempFolder tmp;
  CheckpointStore store(tmp.path() + "/checkpoints");
  write_checkpoint(store, 10);
  store.write_file(20, "shared.bin", "half of step 20");
  overwrite(store.step_folder(20) + "/rng-rank0.bin.tmp.1234", "partial");
  std::vector<std::string> rejected;
  auto found = store.newest_valid(&rejected);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 10);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].find("never completed"), std::string::npos) << rejected[0];
}

// keep = 2: older complete checkpoints go only once a newer one is sealed,
// and an unfinished older folder goes with them.
TEST(CheckpointStore, KeepsTheNewestAndDeletesOlderOnlyAfterANewerIsComplete) {
  TempFolder tmp;
  CheckpointStore store(tmp.path() + "/checkpoints");
  store.write_file(5, "shared.bin", "abandoned");
  write_checkpoint(store, 10, 2);
  write_checkpoint(store, 20, 2);
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{10, 20}));
  store.write_file(30, "shared.bin", "being written");  // not sealed yet: nothing deleted
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{10, 20, 30}));
  store.seal(30, {}, 2);
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{20, 30}));
}

}  // namespace
}  // namespace lockstep
