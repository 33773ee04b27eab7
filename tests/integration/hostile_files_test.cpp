// Hostile data files (tests/python/hostile_fixtures.py) against the real
// `lockstep run`: each is refused with exit 2 naming the file, within 10 s
// and 1 GB of resident memory, before any run folder exists. These inputs
// crashed (a recursive regex on a long .npy header, a wrapped zip64
// offset), hung (a link loop in an image folder), allocated what a zip
// directory claimed, or passed the start and failed mid-run.
#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

struct Refusal {
  std::string name;    // folder or file under the fixtures' root
  std::string needle;  // what the message must say
};

// The peak resident set of the run (GNU time's %M, KiB, the largest of the
// launcher and the workers it waited for), or -1.
int64_t peak_kib(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("peak_rss_kib=([0-9]+)"))) return -1;
  return std::stoll(match[1]);
}

void expect_refused(const TempDir& dir, const std::vector<std::string>& data_sets, const Refusal& c) {
  const std::string runs = dir.path() + "/runs-" + std::to_string(std::hash<std::string>()(c.name));
  // A small batch: the folders are small, and a global batch larger than
  // the training set is refused before the files' own faults would be.
  std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--set", "job.run_dir=" + runs,
                                   "--set", "job.steps=2", "--set", "data.batch_size=8"};
  for (const auto& s : data_sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  const auto result = run_lockstep(args, dir.path(), 30, {}, {"/usr/bin/time", "-f", "peak_rss_kib=%M"});
  EXPECT_EQ(result.exit_code, 2) << c.name << "\n" << result.output;
  EXPECT_LT(result.seconds, 10.0) << c.name;
  const int64_t kib = peak_kib(result.output);
  EXPECT_GT(kib, 0) << c.name << ": no peak in\n" << result.output;
  EXPECT_LT(kib, 1024 * 1024) << c.name << ": peak resident set " << kib << " KiB";
  EXPECT_NE(result.output.find(c.needle), std::string::npos) << c.name << ": no '" << c.needle << "' in\n"
                                                              << result.output;
  EXPECT_FALSE(fs::exists(runs)) << c.name << ": a run folder was created";
}

TEST(HostileFiles, NpyHeadersAndZipRecordsThatLieAreRefusedNamingTheFile) {
  TempDir dir;
  ASSERT_EQ(python_tool("hostile_fixtures.py", "npy " + dir.path()).exit_code, 0);
  const std::string root = dir.path() + "/npy/";
  const std::vector<Refusal> cases = {
      {"long_descr", "long_descr/x.npy: the .npy header is 60"},
      {"long_shape", "long_shape/x.npy: the .npy header has more than 64 dimensions"},
      {"shape_wrap", "shape_wrap/x.npy: the .npy shape (64, 288230376151711744) holds more bytes than fit"},
      {"shape_digits", "shape_digits/x.npy: the .npy header has a dimension in 'shape' that does not fit"},
      {"shape_negative", "shape_negative/x.npy: the .npy header has a negative dimension"},
      {"zip64_far.npz", "zip64_far.npz: not a readable .npz (damaged zip64 record)"},
      {"zip64_directory.npz", "zip64_directory.npz: not a readable .npz"},
      {"claims_4g.npz", "x.npy in " + root + "claims_4g.npz: the zip directory claims 4294967280 bytes"},
      {"label_late", "data.train (arrays) holds class target 200 (row 63) but mlp gives 10 outputs"},
      {"label_negative", "data.train (arrays) holds class target -5 (row 0); class targets are 0 to 9, and -1"},
  };
  for (const auto& c : cases)
    expect_refused(dir, {"data.name=arrays", "data.train=" + root + c.name, "data.test=" + root + "good"}, c);
}

TEST(HostileFiles, ARunInWhichNoStepTrainedFailsInsteadOfSayingCompleted) {
  TempDir dir;
  ASSERT_EQ(python_tool("hostile_fixtures.py", "npy " + dir.path()).exit_code, 0);
  const std::string root = dir.path() + "/npy/";
  const auto result =
      run_lockstep({"run", examples_dir() + "/synthetic.toml", "--set", "job.run_dir=" + dir.path() + "/runs", "--set",
                    "job.steps=4", "--set", "data.name=arrays", "--set", "data.train=" + root + "label_missing",
                    "--set", "data.test=" + root + "good"},
                   dir.path(), 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("no step trained: none of the 4 optimizer steps had a valid target"), std::string::npos)
      << result.output;
  const auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed") << manifest.dump(2);
}

TEST(HostileFiles, ImageFoldersWithLinkLoopsBombsAndForeignNamesAreRefused) {
  TempDir dir;
  ASSERT_EQ(python_tool("hostile_fixtures.py", "img " + dir.path()).exit_code, 0);
  const std::string root = dir.path() + "/img/";
  const std::vector<Refusal> cases = {
      {"loop1", "loop1/train/class03/a: is the folder " + root + "loop1/train/class03 again (a link loop"},
      {"loop2", ": is the folder " + root + "loop2/train/class03 again (a link loop"},
      {"bomb_first", "class00/0-bomb.png: 30000 x 30000 pixels, more than the 89478485 allowed"},
      {"bomb_middle", "class05/2.png: 30000 x 30000 pixels, more than the 89478485 allowed"},
      {"classes11", "data.train (images) holds class target 10 (row 40) but cnn gives 10 outputs (classes 0 to 9): "
                    "the data has 11 classes (class00 ... class10)"},
      {"nonutf8", "class folder 'c\\xff\\xfe9' is not a UTF-8 name"},
  };
  for (const auto& c : cases)
    expect_refused(dir, {"data.name=images", "model.name=cnn", "data.image_size=28",
                         "data.train=" + root + c.name + "/train", "data.test=" + root + c.name + "/test"},
                   c);
  // The folders beside them train: the refusals are about the files.
  const auto good = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--set", "job.run_dir=" + dir.path() + "/ok",
                                  "--set", "job.steps=2", "--set", "data.name=images", "--set", "model.name=cnn",
                                  "--set", "data.batch_size=8", "--set", "data.train=" + root + "good/train", "--set",
                                  "data.test=" + root + "good/test"},
                                 dir.path(), 120);
  EXPECT_EQ(good.exit_code, 0) << good.output;
}

TEST(HostileFiles, ABombIsSkippedUnderBadFilesSkipAndTheRestTrains) {
  TempDir dir;
  ASSERT_EQ(python_tool("hostile_fixtures.py", "img " + dir.path()).exit_code, 0);
  const std::string root = dir.path() + "/img/bomb_first/";
  const auto result = run_lockstep(
      {"run", examples_dir() + "/synthetic.toml", "--set", "job.run_dir=" + dir.path() + "/runs", "--set",
       "job.steps=2", "--set", "data.name=images", "--set", "model.name=cnn", "--set", "data.batch_size=8", "--set",
       "data.bad_files=skip", "--set", "data.train=" + root + "train", "--set", "data.test=" + root + "test"},
      dir.path(), 120, {}, {"/usr/bin/time", "-f", "peak_rss_kib=%M"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("1 file(s) skipped (data.bad_files = skip): " + root + "train/class00/0-bomb.png: 30000 x 30000"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("data.image_size = 28,28"), std::string::npos) << result.output;
  EXPECT_LT(peak_kib(result.output), 1024 * 1024);
}

}  // namespace
}  // namespace lockstep::testing
