// Checkpoints of a real 2-rank run: every checkpoint.every steps and at the
// end, the older ones beyond checkpoint.keep deleted, each complete one
// verifying (index, sizes, checksums) with rank 0's shared state and every
// rank's generator state, and the parameter digest of the last one equal to
// the digest the ranks report at the end.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "integration/jobs.h"
#include "runtime/checkpoint/checkpoint_store.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

TEST(Checkpoints, EveryNStepsAndAtTheEndKeepingTheNewest) {
  TempDir dir;
  auto result = run_lockstep(synthetic_run(dir, 2, {"job.steps=25", "checkpoint.every=10",
                                                    "checkpoint.keep=2", "audit.every=0"}),
                             dir.path(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string run = single_run(dir.path() + "/runs");
  CheckpointStore store(run + "/checkpoints");
  EXPECT_EQ(store.steps(), (std::vector<int64_t>{20, 25}));  // 10 went once 25 was complete

  std::vector<std::string> rejected;
  auto newest = store.newest_valid(&rejected);
  ASSERT_TRUE(newest.has_value());
  EXPECT_TRUE(rejected.empty());
  EXPECT_EQ(newest->step, 25);
  for (const char* file : {"model.pt", "optimizer.bin", "rng-rank0.bin", "rng-rank1.bin"})
    EXPECT_FALSE(store.read_file(*newest, file).empty()) << file;
  EXPECT_NE(store.read_file(*newest, "rng-rank0.bin"), store.read_file(*newest, "rng-rank1.bin"));
  EXPECT_EQ(newest->meta["world_size"], 2);
  EXPECT_EQ(newest->meta["ranks"], 2);
  EXPECT_EQ(newest->meta["model"], "mlp");
  EXPECT_EQ(newest->meta["microbatches_done"], 25);

  auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["checkpoints"], 3);
  EXPECT_EQ(manifest["metrics"]["last_checkpoint_step"], 25);
  EXPECT_EQ(newest->meta["param_digest"], manifest["metrics"]["final_param_digest"]);
  EXPECT_GT(manifest["phases"]["checkpoint"].get<double>(), 0.0);
}

}  // namespace
}  // namespace lockstep::testing

namespace lockstep::testing {
namespace {

// The cnn (dropout 0.25) on 2 ranks for 12 steps, a checkpoint every 4.
std::vector<std::string> resumable_job(const TempDir& dir, const std::string& optimizer,
                                       std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.name=cnn", "job.steps=12", "checkpoint.every=4",
                                   "optim.name=" + optimizer, "optim.lr=0.01",
                                   "optim.schedule=cosine", "job.log_every=4"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return synthetic_run(dir, 2, sets);
}

std::string final_digest(const std::string& run) {
  return read_json(run + "/manifest.json")["metrics"]["final_param_digest"].get<std::string>();
}

// A run that rank 1 leaves at step 6 (after the checkpoint of step 4),
// resumed with --resume: the same final parameters, bit for bit, as the run
// that was never interrupted (SGD with momentum and AdamW, dropout on).
TEST(Checkpoints, ResumedRunEndsWithTheUninterruptedRunsDigest) {
  for (const std::string optimizer : {"sgd", "adamw"}) {
    TempDir whole, broken;
    auto uninterrupted = run_lockstep(resumable_job(whole, optimizer), whole.path(), 150);
    ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
    const std::string expected = final_digest(single_run(whole.path() + "/runs"));

    auto first = run_lockstep(resumable_job(broken, optimizer, {"fault.max_restarts=0", "test.fail_rank=1", "test.fail_step=6",
                                                                "test.fail_kind=exit"}),
                              broken.path(), 150);
    ASSERT_NE(first.exit_code, 0) << first.output;
    const std::string run = single_run(broken.path() + "/runs");
    auto args = resumable_job(broken, optimizer);
    args.push_back("--resume");
    args.push_back(run);
    auto resumed = run_lockstep(args, broken.path(), 150);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("Decision: resume_checkpoint = step 4"), std::string::npos)
        << resumed.output;
    EXPECT_EQ(final_digest(run), expected) << optimizer;
    EXPECT_EQ(read_json(run + "/manifest.json")["metrics"]["steps"], 12);
  }
}

// --resume continues the run it resumes: its settings come from the
// checkpoint (nothing has to be repeated), a step count at or before the
// checkpoint is said (done, or bad input), and job.run_dir written relative
// then absolute is no change.
TEST(Checkpoints, ResumeTakesTheCheckpointsSettingsAndSaysWhenNothingIsLeft) {
  TempDir dir;
  const std::vector<std::string> first = {"run", examples_dir() + "/synthetic.toml", "--nproc", "2",
                                          "--set", "job.run_dir=runs", "--set", "job.steps=10",
                                          "--set", "checkpoint.every=5", "--set", "optim.lr=0.0123"};
  ASSERT_EQ(run_lockstep(first, dir.path(), 120).exit_code, 0);
  const std::string run = single_run(dir.path() + "/runs");
  const std::string manifest_before = read_json(run + "/manifest.json").dump();
  auto resume = [&](std::vector<std::string> sets) {
    std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--nproc", "2", "--resume", run};
    for (auto& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    return run_lockstep(args, dir.path(), 120);
  };
  auto past = resume({"job.steps=5"});
  EXPECT_EQ(past.exit_code, 2) << past.output;
  EXPECT_NE(past.output.find("the newest checkpoint is at step 10, past job.steps = 5"), std::string::npos)
      << past.output;
  auto done = resume({});
  EXPECT_EQ(done.exit_code, 0) << done.output;
  EXPECT_NE(done.output.find("Decision: resume = nothing to train (run " + fs::path(run).filename().string() +
                             " is already complete"), std::string::npos) << done.output;
  EXPECT_EQ(read_json(run + "/manifest.json").dump(), manifest_before) << "nothing was to be written";

  auto further = resume({"job.steps=14"});
  ASSERT_EQ(further.exit_code, 0) << further.output;
  EXPECT_NE(further.output.find("Decision: resume_settings = those stored in the checkpoint of step 10"),
            std::string::npos) << further.output;
  EXPECT_NE(further.output.find("resume_settings_changed = job.steps: 10 -> 14"), std::string::npos)
      << further.output;
  EXPECT_EQ(further.output.find("optim.lr: "), std::string::npos) << "optim.lr had to be repeated";
  EXPECT_EQ(further.output.find("job.run_dir: "), std::string::npos) << "the same folder counted as a change";
  auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["steps"], 14);
}

// A run that rank 0 leaves at step 9, with complete checkpoints at steps 4
// and 8; its folder.
std::string run_failing_at_step_9(const TempDir& dir) {
  auto first = run_lockstep(resumable_job(dir, "sgd", {"fault.max_restarts=0", "test.fail_rank=0", "test.fail_step=9",
                                                       "test.fail_kind=exit", "checkpoint.keep=3"}),
                            dir.path(), 150);
  EXPECT_NE(first.exit_code, 0) << first.output;
  return single_run(dir.path() + "/runs");
}

// An index that lost the entry of a file resuming reads is not verified:
// the older checkpoint is used, and the damage is named.
TEST(Checkpoints, AnIndexMissingAFileEntryFallsBackToTheOlderCheckpoint) {
  TempDir dir;
  const std::string run = run_failing_at_step_9(dir);
  CheckpointStore store(run + "/checkpoints");
  ASSERT_EQ(store.steps(), (std::vector<int64_t>{4, 8}));
  const std::string index_path = store.step_folder(8) + "/index.json";
  auto index = read_json(index_path);
  ASSERT_TRUE(index["files"].contains("rng-rank1.bin"));
  index["files"].erase("rng-rank1.bin");
  std::ofstream(index_path) << index.dump(2);

  auto args = resumable_job(dir, "sgd");
  args.push_back("--resume");
  args.push_back(run);
  auto resumed = run_lockstep(args, dir.path(), 150);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resume_checkpoint = step 4"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("lists no rng-rank1.bin, which resuming reads"), std::string::npos)
      << resumed.output;
}

// A checkpoint is device-independent: its tensors are saved on the host and
// its index names the device that wrote it. Resumed where it was written
// (the CPU) that is said in passing; a checkpoint a GPU wrote (its index
// edited here: the index's meta is not checksummed, the files are) resumes
// on the CPU with a warning that the bits from then on are the CPU's.
TEST(Checkpoints, TheDeviceThatWroteACheckpointAndTheOneThatResumesItAreSaid) {
  TempDir dir;
  const std::string run = run_failing_at_step_9(dir);
  CheckpointStore store(run + "/checkpoints");
  const std::string index_path = store.step_folder(8) + "/index.json";
  auto index = read_json(index_path);
  ASSERT_EQ(index["meta"]["device"], "cpu") << index.dump();
  auto resume = [&] {
    auto args = resumable_job(dir, "sgd");
    args.push_back("--resume");
    args.push_back(run);
    return run_lockstep(args, dir.path(), 150);
  };
  auto same = resume();
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("Decision: checkpoint_device = cpu -> cpu (tensors are saved on the host"),
            std::string::npos) << same.output;

  std::filesystem::remove_all(store.step_folder(12));  // the resumed run's last: step 8 is resumed again
  index["meta"]["device"] = "cuda:0";
  std::ofstream(index_path) << index.dump(2);
  auto moved = resume();
  ASSERT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_NE(moved.output.find("resume_checkpoint = step 8"), std::string::npos) << moved.output;
  EXPECT_NE(moved.output.find("checkpoint_device = cuda:0 -> cpu (a checkpoint is device-independent"),
            std::string::npos) << moved.output;
  EXPECT_NE(moved.output.find("not bit-identical to one that stayed on cuda:0"), std::string::npos) << moved.output;
}

// The gradient scaler's state travels in the checkpoint: a run stopped after
// a skipped step and resumed ends with the uninterrupted run's scale, skip
// count and parameters.
TEST(Checkpoints, ResumeKeepsTheGradScalerState) {
  const std::vector<std::string> scaled = {"precision.scaler=on", "precision.init_scale=1024",
                                           "precision.growth_interval=3",
                                           "fault.inject=inf_grad:fc.weight:1:3"};
  TempDir whole, broken;
  ASSERT_EQ(run_lockstep(resumable_job(whole, "sgd", scaled), whole.path(), 150).exit_code, 0);
  auto expected = read_json(single_run(whole.path() + "/runs") + "/manifest.json");
  std::vector<std::string> failing = scaled;
  for (std::string s : {"fault.max_restarts=0", "test.fail_rank=1", "test.fail_step=6", "test.fail_kind=exit"}) failing.push_back(s);
  ASSERT_NE(run_lockstep(resumable_job(broken, "sgd", failing), broken.path(), 150).exit_code, 0);
  const std::string run = single_run(broken.path() + "/runs");
  auto args = resumable_job(broken, "sgd", scaled);
  args.push_back("--resume");
  args.push_back(run);
  auto resumed = run_lockstep(args, broken.path(), 150);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["metrics"]["scaler"], expected["metrics"]["scaler"]) << manifest["metrics"].dump(2);
  EXPECT_EQ(manifest["metrics"]["scaler"]["skipped"], 1);
  EXPECT_EQ(final_digest(run), expected["metrics"]["final_param_digest"]);
  auto newest = CheckpointStore(run + "/checkpoints").newest_valid(nullptr);
  ASSERT_TRUE(newest);
  EXPECT_EQ(newest->meta["scaler"]["scale"], manifest["metrics"]["scaler"]["final_scale"]);
  EXPECT_TRUE(newest->meta.contains("config_digest"));
}

// The newest checkpoint corrupted: refused naming the file, the previous one
// used (and the run still ends where the uninterrupted one did). With none
// valid, or with a setting a resumed run cannot change: exit 2, named.
TEST(Checkpoints, CorruptedNewestFallsBackAndUnusableOnesAreBadInput) {
  TempDir dir;
  const std::string run = run_failing_at_step_9(dir);
  CheckpointStore store(run + "/checkpoints");
  ASSERT_EQ(store.steps(), (std::vector<int64_t>{4, 8}));
  {
    std::fstream file(store.step_folder(8) + "/model.pt", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x5a');
  }
  auto resume = [&](std::vector<std::string> extra) {
    auto args = resumable_job(dir, "sgd", extra);
    args.push_back("--resume");
    args.push_back(run);
    return run_lockstep(args, dir.path(), 150);
  };
  auto changed = resume({"data.batch_size=16"});
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_NE(changed.output.find("data.global_batch was 64 in the checkpointed run and is 32 now"), std::string::npos) << changed.output;

  auto resumed = resume({"checkpoint.keep=2"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resume_checkpoint = step 4"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step-000000008/model.pt: checksum"), std::string::npos)
      << resumed.output;
  // Settings a resumed run may change are allowed, and said.
  EXPECT_NE(resumed.output.find("Decision: resume_settings_changed = checkpoint.keep: 3 -> 2"),
            std::string::npos) << resumed.output;

  TempDir whole;
  ASSERT_EQ(run_lockstep(resumable_job(whole, "sgd"), whole.path(), 150).exit_code, 0);
  EXPECT_EQ(final_digest(run), final_digest(single_run(whole.path() + "/runs")));

  for (int64_t step : CheckpointStore(run + "/checkpoints").steps())
    std::filesystem::resize_file(store.step_folder(step) + "/optimizer.bin", 3);
  const std::string manifest_before = read_json(run + "/manifest.json").dump();
  auto none = resume({});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no complete checkpoint that verifies"), std::string::npos)
      << none.output;
  EXPECT_EQ(read_json(run + "/manifest.json").dump(), manifest_before) << "a refused resume wrote into the run";
}

}  // namespace
}  // namespace lockstep::testing

namespace lockstep::testing {
namespace {

// The whole job killed (SIGKILL to every process) at random moments while
// it checkpoints every step: whatever it leaves, a checkpoint that has an
// index verifies, and the newest valid one is found.
TEST(Checkpoints, KillDuringWritesNeverLeavesACompleteLookingBrokenCheckpoint) {
  std::random_device random;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TempDir dir;
    const int delay_ms = 200 + int(random() % 2000);
    std::cout << "attempt " << attempt << ": killing everything " << delay_ms
              << " ms after the run folder exists" << std::endl;
    LockstepProcess job(synthetic_run(dir, 2, {"model.name=cnn", "job.steps=400",
                                               "checkpoint.every=1", "checkpoint.keep=1000",
                                               "audit.every=0"}),
                        dir.path());
    ASSERT_TRUE(job.wait_for_output("run folder:", 60)) << job.output();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    job.kill_group();
    job.wait(10);
    const std::string run = single_run(dir.path() + "/runs");
    CheckpointStore store(run + "/checkpoints");
    int sealed = 0;
    for (int64_t step : store.steps()) {
      if (!std::filesystem::exists(store.step_folder(step) + "/index.json")) continue;
      ++sealed;
      FoundCheckpoint found{step, store.step_folder(step), {}};
      for (const char* file : {"model.pt", "optimizer.bin", "rng-rank0.bin", "rng-rank1.bin"})
        EXPECT_NO_THROW(store.read_file(found, file)) << "step " << step << " " << file;
    }
    std::vector<std::string> rejected;
    auto newest = store.newest_valid(&rejected);
    std::cout << "  " << store.steps().size() << " checkpoint folders, " << sealed << " sealed, "
              << rejected.size() << " refused" << std::endl;
    EXPECT_EQ(newest.has_value(), sealed > 0);
    for (const auto& r : rejected) EXPECT_NE(r.find("never completed"), std::string::npos) << r;
  }
}

}  // namespace
}  // namespace lockstep::testing
