// data.name = "images" against what PIL reads from the same files
// (tests/python/image_fixtures.py): pixels, classes, order, channels,
// resizing, decoding threads, and files that do not decode.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "runtime/data/dataset.h"
#include "runtime/base/errors.h"
#include "support/shell.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

using Folder = testing::TempDir;

std::string python(const std::string& args) {
  auto run = testing::python_tool("image_fixtures.py", args);
  EXPECT_EQ(run.exit_code, 0) << "image_fixtures.py " << args;
  return run.output;
}

DataSection images(const std::string& root) {
  DataSection data;
  data.name = "images";
  data.train = root + "/train";
  data.test = root + "/test";
  data.scale = 1.0;  // raw pixel values, to compare with PIL's
  return data;
}

bool have_fmnist() { return fs::exists("/usr/share/datasets/fashion-mnist"); }

TEST(Images, ClassesFilesAndPixelsAreThoseTorchvisionAndPilSee) {
  if (!have_fmnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Folder dir;
  python("good " + dir.path() + " 20 5");
  TrainTestData data = load_data(images(dir.path()), 1);
  ASSERT_EQ(data.classes.size(), 10u);
  EXPECT_EQ(data.classes.front(), "Ankle_boot");  // sorted by name, not Fashion-MNIST's label order
  EXPECT_EQ(data.classes.back(), "Trouser");
  ASSERT_EQ(data.train.size(), 200);
  EXPECT_EQ(data.test.size(), 50);
  EXPECT_EQ(data.train.inputs.sizes(), (std::vector<int64_t>{200, 1, 28, 28}));
  // Files in class order, then by name; labels their class's index.
  const auto& files = data.folders.at(0).second;
  ASSERT_EQ(files.size(), 200u);
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string cls = fs::path(files[i]).parent_path().filename().string();
    EXPECT_EQ(data.classes.at(size_t(data.train.targets[int64_t(i)].item<int64_t>())), cls) << files[i];
    if (i > 0) EXPECT_LT(files[i - 1], files[i]);
  }
  // Pixels: exactly PIL's, PNG and JPEG (PIL decodes JPEG with the same libjpeg).
  std::string list;
  std::vector<size_t> native;
  for (size_t i = 0; i < files.size() && native.size() < 40; ++i) {
    const std::string name = fs::path(files[i]).stem().string();
    if (std::stoi(name) % 50 == 7) continue;  // stored at 56 x 56: resized here, not in PIL
    native.push_back(i);
    list += " " + files[i];
  }
  const auto sums = nlohmann::json::parse(python("pil " + dir.path() + list));
  const at::Tensor rows = torch::tensor(std::vector<int64_t>(native.begin(), native.end()), torch::kLong);
  const at::Tensor pixels = data.train.input_rows(rows);
  int jpegs = 0;
  for (size_t k = 0; k < native.size(); ++k) {
    const double ours = pixels[int64_t(k)].sum().item<double>(), theirs = sums[k].get<double>();
    EXPECT_EQ(ours, theirs) << files[native[k]];
    if (fs::path(files[native[k]]).extension() == ".jpg") ++jpegs;
  }
  EXPECT_GT(jpegs, 5);
  // data.validation naming a folder: the training set's classes and shape.
  DataSection with_validation = images(dir.path());
  with_validation.validation = dir.path() + "/test";
  TrainTestData split = load_data(with_validation, 1);
  EXPECT_EQ(split.validation.size(), 50);
  EXPECT_EQ(split.validation.inputs.sizes(), (std::vector<int64_t>{50, 1, 28, 28}));
  EXPECT_EQ(split.folders.size(), 3u);
  EXPECT_TRUE(split.validation.targets.equal(split.test.targets));
}

TEST(Images, ChannelsSizeAndThreadsChangeTheShapeNotThePixels) {
  if (!have_fmnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Folder dir;
  python("good " + dir.path() + " 10 2");
  DataSection section = images(dir.path());
  section.channels = 3;
  section.image_size = "14,21";
  TrainTestData data = load_data(section, 1);
  const at::Tensor all = torch::arange(data.train.size(), torch::kLong);
  const at::Tensor one_thread = data.train.input_rows(all);
  EXPECT_EQ(one_thread.sizes(), (std::vector<int64_t>{100, 3, 14, 21}));
  EXPECT_TRUE(one_thread.select(1, 0).equal(one_thread.select(1, 2))) << "grey repeated into R, G and B";
  data.set_reader_threads(3);
  EXPECT_TRUE(data.train.input_rows(all).equal(one_thread)) << "decoding on 3 threads changed the pixels";
  EXPECT_GT(one_thread.max().item<double>(), 200.0);
}

TEST(Images, AFileThatIsCutOrForeignIsNamedAtTheStartOrSkippedAndCounted) {
  if (!have_fmnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Folder dir;
  python("good " + dir.path() + " 10 2");
  python("corrupt " + dir.path());
  try {
    load_data(images(dir.path()), 1);
    FAIL() << "a cut PNG and a text file named .jpg were accepted";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cut.png: PNG without its IEND chunk"), std::string::npos) << message;
    EXPECT_NE(message.find("and 1 more file(s) in data.train"), std::string::npos) << message;
    EXPECT_NE(message.find("data.bad_files = skip"), std::string::npos) << message;
  }
  DataSection skip = images(dir.path());
  skip.bad_files = "skip";
  TrainTestData data = load_data(skip, 1);
  ASSERT_EQ(data.bad_files.size(), 2u);
  EXPECT_NE(data.bad_files[1].find("not-an-image.jpg: neither PNG nor JPEG"), std::string::npos) << data.bad_files[1];
  EXPECT_EQ(data.train.size(), 100);
}

TEST(Images, AFileThatOnlyFailsToDecodeStopsTheReadOrBecomesAMissingTarget) {
  if (!have_fmnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Folder dir;
  python("good " + dir.path() + " 10 2");
  python("damaged " + dir.path());
  DataSection section = images(dir.path());
  TrainTestData data = load_data(section, 1);  // header and end intact: passes the first check
  const auto& files = data.folders.at(0).second;
  const int64_t damaged = std::find_if(files.begin(), files.end(), [](const std::string& f) {
                            return f.find("damaged.png") != std::string::npos;
                          }) - files.begin();
  ASSERT_LT(damaged, int64_t(files.size()));
  const at::Tensor rows = torch::tensor({int64_t(0), damaged, int64_t(1)}, torch::kLong);
  try {
    data.train.input_rows(rows);
    FAIL() << "damaged.png decoded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("damaged.png: does not decode (PNG: "), std::string::npos) << e.what();
  }
  section.bad_files = "skip";
  TrainTestData skipping = load_data(section, 1);
  std::vector<int64_t> unreadable;
  const at::Tensor pixels = skipping.train.input_rows(rows, &unreadable);
  EXPECT_EQ(unreadable, (std::vector<int64_t>{1}));
  EXPECT_EQ(pixels[1].abs().sum().item<double>(), 0.0);
  EXPECT_GT(pixels[0].abs().sum().item<double>(), 0.0);
  const at::Tensor targets = skipping.train.target_rows(rows, unreadable);
  EXPECT_EQ(targets[1].item<int64_t>(), -1) << "the skipped image's target must count as missing";
  EXPECT_GE(targets[0].item<int64_t>(), 0);
  EXPECT_EQ(skipping.unreadable_in_batches(), 1);
}

TEST(Images, FoldersThatDoNotFitAreRefusedNamingTheFolder) {
  Folder dir;
  fs::create_directories(dir.path() + "/train/cat");
  fs::create_directories(dir.path() + "/test/cat");
  std::ofstream(dir.path() + "/train/cat/note.txt") << "no images";
  auto message_of = [](const DataSection& section) {
    try {
      load_data(section, 1);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message_of(images(dir.path())).find("train/cat: class folder without any .png"), std::string::npos);
  fs::remove_all(dir.path() + "/train/cat");
  EXPECT_NE(message_of(images(dir.path())).find("holds no sub-folders"), std::string::npos);
  EXPECT_NE(message_of(images(dir.path() + "/nowhere")).find("no such folder"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
