#include "runtime/job/config.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/base/errors.h"
#include "runtime/data/dataset.h"

namespace lockstep {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             ("lockstep-config-" + std::to_string(::getpid()) + ".toml")).string();
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // The InputError message load_job_config throws, or "" if none.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      load_job_config(write(text), overrides);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
  std::string path_;
};

TEST_F(ConfigTest, ReadsKeysAndRecordsWhereEachCameFrom) {
  JobConfig c = load_job_config(
      write("device = \"cpu\"\n[job]\nworld_size = 3\nsteps = 7\n[optim]\nlr = 1\nname = \"adamw\"\n"),
      {"optim.lr=0.25", "data.batch_size=8"});
  EXPECT_EQ(c.job.world_size, 3);
  EXPECT_EQ(c.job.steps, 7);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.25);  // --set wins over the file
  EXPECT_EQ(c.data.batch_size, 8);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.sources.at("optim.lr"), "--set");
  EXPECT_EQ(c.sources.at("job.world_size"), path_);
  EXPECT_EQ(c.sources.at("comm.bucket_mb"), "default");
  nlohmann::json j = to_json(c);
  EXPECT_EQ(j["optim"]["name"], "adamw");
  EXPECT_EQ(j["device"], "cpu");
}

TEST_F(ConfigTest, UnknownKeyNamesItAndSuggestsTheNearestKnownOne) {
  std::string e = error_of("[job]\nsteps = 1\n[optim]\nlrr = 0.1\n");
  EXPECT_NE(e.find("unknown key 'optim.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;
  EXPECT_NE(e.find(":4"), std::string::npos) << "line number missing: " << e;
  EXPECT_NE(error_of("[jobs]\nsteps = 1\n").find("unknown key 'jobs'"), std::string::npos);
  EXPECT_NE(error_of("[job]\nsteps = 1\n", {"optim.moment=0.5"}).find("did you mean 'optim.momentum'"),
            std::string::npos);
}

TEST_F(ConfigTest, WrongTypeNamesKeyAndAllowedValues) {
  std::string e = error_of("[job]\nsteps = 1\nworld_size = \"two\"\n");
  EXPECT_NE(e.find("'job.world_size' must be an integer"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"job.world_size=two"});
  EXPECT_NE(e.find("'job.world_size' must be an integer"), std::string::npos) << e;
  EXPECT_NE(e.find("'two'"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"test.no_reseed=yes"});
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
}

TEST_F(ConfigTest, OutOfRangeAndBadChoicesAreErrors) {
  std::string e = error_of("[job]\nsteps = 1\nworld_size = 0\n");
  EXPECT_NE(e.find("'job.world_size' must be an integer in [1, 65536], got 0"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"optim.name=lion"});
  EXPECT_NE(e.find("one of: sgd, adamw, adam, rmsprop"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"optim.lr=0"});
  EXPECT_NE(e.find("(0, 1000]"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"precision=fp8"});
  EXPECT_NE(e.find("auto, fp32, bf16, fp16"), std::string::npos) << e;
}

TEST_F(ConfigTest, ImageSizeMeanAndStdTakeTheTomlFormsAUserWrites) {
  const std::string images = "[job]\nsteps = 1\n[data]\nname = \"images\"\ntrain = \"t\"\ntest = \"v\"\n";
  for (const char* form : {"image_size = 28", "image_size = [28, 28]", "image_size = \"28\"", "image_size = \"28,28\""}) {
    const JobConfig c = load_job_config(write(images + form + "\n"), {});
    EXPECT_TRUE(c.data.image_size == "28" || c.data.image_size == "28,28") << form << ": " << c.data.image_size;
  }
  EXPECT_EQ(load_job_config(write(images + "image_size = [64, 48]\n"), {}).data.image_size, "64,48");
  EXPECT_EQ(load_job_config(write(images), {"data.image_size=[64,48]"}).data.image_size, "64,48");
  EXPECT_EQ(load_job_config(write(images), {"data.image_size=28"}).data.image_size, "28");
  const JobConfig normalised = load_job_config(write(images + "mean = [0.2860402, 0.5]\nstd = [0.353, 1]\n"), {});
  EXPECT_EQ(normalised.data.mean, "0.2860402,0.5");
  EXPECT_EQ(normalised.data.std, "0.353,1");
  std::string e = error_of(images + "image_size = [28, \"x\"]\n", {});
  EXPECT_NE(e.find("data.image_size"), std::string::npos) << e;
  e = error_of(images + "image_size = [0, 28]\n", {});
  EXPECT_NE(e.find("each 1 to 16384 pixels"), std::string::npos) << e;
}

TEST_F(ConfigTest, ImageFolderKeysAreCheckedAndTheirScaleIsADecision) {
  const std::string images = "[job]\nsteps = 1\n[data]\nname = \"images\"\ntrain = \"t\"\ntest = \"v\"\n";
  JobConfig c = load_job_config(write(images), {"data.image_size=64,48", "data.workers=3"});
  EXPECT_DOUBLE_EQ(c.data.scale, 1.0 / 255.0);
  ASSERT_FALSE(c.decisions.empty());
  EXPECT_EQ(c.decisions.back().what, "data.scale");
  EXPECT_DOUBLE_EQ(load_job_config(write(images), {"data.scale=1"}).data.scale, 1.0) << "a scale the user set stays";
  std::string e = error_of(images, {"data.image_size=64x48"});
  EXPECT_NE(e.find("'data.image_size' = '64x48': one size"), std::string::npos) << e;
  e = error_of(images, {"data.channels=2"});
  EXPECT_NE(e.find("1 (grey), 3 (RGB) or 0"), std::string::npos) << e;
  e = error_of(images, {"data.bad_files=ignore"});
  EXPECT_NE(e.find("one of: error, skip"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n", {"data.workers=2"});
  EXPECT_NE(e.find("apply to data.name = images only (now fashion-mnist)"), std::string::npos) << e;
  e = error_of("[job]\nsteps = 1\n[data]\nname = \"images\"\n");
  EXPECT_NE(e.find("data.name = images needs data.train and data.test"), std::string::npos) << e;
}

TEST_F(ConfigTest, StepsAndEpochsAreExclusive) {
  EXPECT_NE(error_of("[job]\nsteps = 1\nepochs = 2\n").find("exactly one of job.steps and job.epochs"),
            std::string::npos);
  EXPECT_NE(error_of("[job]\nname = \"x\"\n").find("exactly one of"), std::string::npos);
}

TEST_F(ConfigTest, MalformedOverrideAndMissingFileAreErrors) {
  EXPECT_NE(error_of("[job]\nsteps = 1\n", {"optim.lr"}).find("expected key=value"),
            std::string::npos);
  try {
    load_job_config("/nonexistent/job.toml", {});
    FAIL() << "no error for a missing job file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/job.toml"), std::string::npos);
  }
  EXPECT_NE(error_of("[job\nsteps = 1\n").find("TOML syntax error"), std::string::npos);
}

TEST_F(ConfigTest, TheCommandLinesRunLengthReplacesTheFilesAsADecision) {
  JobConfig c = load_job_config(write("[job]\nepochs = 5\n"), {"job.steps=300"});
  EXPECT_EQ(c.job.steps, 300);
  EXPECT_EQ(c.job.epochs, 0);
  ASSERT_EQ(c.decisions.size(), 3u);  // and data.global_batch from the per-rank keys, and each rank's share
  EXPECT_EQ(c.decisions[1].what, "data.global_batch");
  EXPECT_EQ(c.decisions[2].what, "microbatches_per_rank");
  EXPECT_EQ(c.decisions[0].what, "run_length");
  EXPECT_EQ(c.decisions[0].value, "300 steps");
  EXPECT_NE(c.decisions[0].reason.find("replaces job.epochs = 5 from " + path_), std::string::npos)
      << c.decisions[0].reason;
  EXPECT_EQ(c.sources["job.epochs"], "cleared by --set job.steps");
  c = load_job_config(write("[job]\nsteps = 40\n"), {"job.epochs=2"});
  EXPECT_EQ(c.job.steps, 0);
  EXPECT_EQ(c.job.epochs, 2);
  // Both from one source stay an error: the file, or the command line.
  EXPECT_NE(error_of("[job]\nsteps = 4\nepochs = 1\n").find("exactly one of"), std::string::npos);
  EXPECT_NE(error_of("[job]\nsteps = 4\n", {"job.steps=5", "job.epochs=1"}).find("exactly one of"),
            std::string::npos);
  // New keys, checked like every other.
  EXPECT_NE(error_of("[job]\nsteps = 4\nthreads_per_rank = -1\n").find("job.threads_per_rank"),
            std::string::npos);
  EXPECT_EQ(load_job_config(write("[job]\nsteps = 4\n[comm]\ninterface = \"eth0\"\n"), {})
                .comm.interface, "eth0");
}

TEST_F(ConfigTest, TestSwitchRanksMustExist) {
  std::string e = error_of("[job]\nsteps = 1\nworld_size = 2\n", {"test.fail_rank=2"});
  EXPECT_NE(e.find("test.fail_rank"), std::string::npos) << e;
}


// The work of a step is the job's: data.global_batch in microbatches of
// data.microbatch, k / W of them per rank. A job in the per-rank keys maps
// onto them (said as a decision); a world size that does not divide k, a
// global batch that is no multiple of the microbatch, and per-rank keys that
// contradict them are refused, naming what would work.
TEST_F(ConfigTest, TheGlobalBatchFixesTheWorkAndTheWorldSizeOnlyDividesIt) {
  // Every job here: 5 steps.
  auto load = [&](const std::string& text, std::vector<std::string> sets = {}) {
    sets.push_back("job.steps=5");
    return load_job_config(write(text), sets);
  };
  JobConfig old_way = load("[job]\nworld_size = 4\n[data]\nbatch_size = 16\n[train]\naccum_steps = 2\n");
  EXPECT_EQ(old_way.data.global_batch, 128);
  EXPECT_EQ(old_way.data.microbatch, 16);
  ASSERT_GE(old_way.decisions.size(), 2u);
  EXPECT_EQ(old_way.decisions.back().what, "microbatches_per_rank");
  EXPECT_EQ(old_way.decisions.back().value, "2");
  const ConfigDecision& mapped = old_way.decisions[old_way.decisions.size() - 2];
  EXPECT_EQ(mapped.what, "data.global_batch");
  EXPECT_NE(mapped.reason.find("data.batch_size = 16 per rank x train.accum_steps = 2 x "
                                                 "job.world_size = 4"), std::string::npos);
  for (int world : {1, 2, 4, 8}) {
    JobConfig c = load("[job]\nworld_size = " + std::to_string(world) +
                                        "\n[data]\nglobal_batch = 128\nmicrobatch = 16\n");
    EXPECT_EQ(c.train.accum_steps, 8 / world) << world;
    EXPECT_EQ(c.data.batch_size, 16);
    EXPECT_EQ(c.decisions.back().what, "microbatches_per_rank");
  }
  auto refused = [&](const std::string& text, const std::vector<std::string>& sets = {}) {
    try {
      load(text, sets);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string three = refused("[job]\nworld_size = 3\n[data]\nglobal_batch = 128\nmicrobatch = 16\n");
  EXPECT_NE(three.find("job.world_size = 3 does not divide the 8 microbatches of a step"), std::string::npos) << three;
  EXPECT_NE(three.find("world sizes that do: 1, 2, 4, 8"), std::string::npos) << three;
  EXPECT_NE(refused("[data]\nglobal_batch = 100\nmicrobatch = 16\n").find("is not a multiple of data.microbatch = 16"),
            std::string::npos);
  EXPECT_NE(refused("[data]\nmicrobatch = 16\n").find("needs data.global_batch"), std::string::npos);
  EXPECT_NE(refused("[data]\nglobal_batch = 64\nmicrobatch = 16\nbatch_size = 32\n").find("disagree"),
            std::string::npos);
  EXPECT_NE(refused("[data]\nglobal_batch = 64\nmicrobatch = 16\n[train]\naccum_steps = 2\n")
                .find("means 4 microbatches per rank; leave train.accum_steps out"), std::string::npos);
  // A microbatch larger than the data is a global batch larger than it.
  JobConfig big = load("[data]\nname = \"synthetic\"\nsynthetic_samples = 100\n"
                                        "global_batch = 256\nmicrobatch = 256\n");
  try {
    load_data(big.data, 1);
    FAIL() << "a global batch larger than the training set was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("data.global_batch = 256 is more than the 100 training samples"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep
