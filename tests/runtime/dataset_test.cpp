#include "runtime/data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> idx_bytes(uint32_t magic, std::vector<uint32_t> dims, size_t data_bytes) {
  std::vector<uint8_t> out;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(uint8_t(i % 251));
  return out;
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

std::string error_of(const std::string& path, int dims) {
  try {
    read_idx_gz(path, dims);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lockstep-idx-" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(IdxTest, ReadsShapeAndBytes) {
  write_gzip(dir_ + "/ok.gz", idx_bytes(0x803, {2, 3, 4}, 24));
  at::Tensor t = read_idx_gz(dir_ + "/ok.gz", 3);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t.flatten()[23].item<int>(), 23);
}

TEST_F(IdxTest, WrongMagicIsNamed) {
  write_gzip(dir_ + "/labels.gz", idx_bytes(0x801, {5}, 5));
  std::string e = error_of(dir_ + "/labels.gz", 3);
  EXPECT_NE(e.find("labels.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("magic 0x00000801, expected 0x00000803"), std::string::npos) << e;
}

TEST_F(IdxTest, ShortDataIsTruncated) {
  write_gzip(dir_ + "/short.gz", idx_bytes(0x803, {10, 28, 28}, 100));
  std::string e = error_of(dir_ + "/short.gz", 3);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("7840"), std::string::npos) << e;
}

TEST_F(IdxTest, CutGzipStreamIsTruncated) {
  write_gzip(dir_ + "/full.gz", idx_bytes(0x803, {50, 28, 28}, 50 * 784));
  auto size = fs::file_size(dir_ + "/full.gz");
  fs::copy_file(dir_ + "/full.gz", dir_ + "/cut.gz");
  fs::resize_file(dir_ + "/cut.gz", size / 2);
  std::string e = error_of(dir_ + "/cut.gz", 3);
  EXPECT_NE(e.find("cut.gz"), std::string::npos) << e;
  EXPECT_TRUE(e.find("truncated") != std::string::npos) << e;
}

TEST_F(IdxTest, MissingFileNamesIt) {
  std::string e = error_of(dir_ + "/nope.gz", 1);
  EXPECT_NE(e.find("nope.gz: file not found"), std::string::npos) << e;
  DataSection data;
  data.path = dir_ + "/absent";
  try {
    check_data_files(data);
    FAIL() << "no error for a missing data.path";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("data.path = " + data.path), std::string::npos);
  }
}

TEST_F(IdxTest, ReadingStopsAtWhatTheHeaderPromises) {
  // 64 MiB of zeros behind a header promising 256 bytes: refused after 257.
  std::vector<uint8_t> bomb = idx_bytes(0x801, {256}, 256);
  bomb.resize(bomb.size() + (64u << 20), 0);
  write_gzip(dir_ + "/bomb.gz", bomb);
  const auto start = std::chrono::steady_clock::now();
  std::string e = error_of(dir_ + "/bomb.gz", 1);
  EXPECT_NE(e.find("too long: the header promises 256 bytes"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "it inflated everything";
}

TEST_F(IdxTest, SizesThatWouldOverflowAndEmptyFilesAreRefused) {
  write_gzip(dir_ + "/huge.gz", idx_bytes(0x803, {1u << 31, 1u << 31, 4}, 16));
  EXPECT_NE(error_of(dir_ + "/huge.gz", 3).find("promises more than 4 GiB"), std::string::npos);
  write_gzip(dir_ + "/empty.gz", idx_bytes(0x801, {0}, 0));
  EXPECT_NE(error_of(dir_ + "/empty.gz", 1).find("holds 0 items"), std::string::npos);
}

TEST_F(IdxTest, NonRegularFilesAreRefusedWithoutReading) {
  EXPECT_NE(error_of("/dev/zero", 1).find("/dev/zero: not a regular file"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir_ + "/pipe.gz").c_str(), 0600), 0);
  EXPECT_NE(error_of(dir_ + "/pipe.gz", 1).find("not a regular file"), std::string::npos);  // no hang
}

// A data folder whose images or labels the models cannot take.
TEST_F(IdxTest, ShapesLabelsAndCountsTheModelsCannotTakeAreBadInput) {
  auto folder = [&](const std::string& name, std::vector<uint32_t> image_dims, uint8_t top_label,
                    uint32_t labels) {
    const std::string d = dir_ + "/" + name;
    fs::create_directories(d);
    for (const char* prefix : {"train", "t10k"}) {
      write_gzip(d + "/" + prefix + "-images-idx3-ubyte.gz",
                 idx_bytes(0x803, image_dims, size_t(image_dims[0]) * image_dims[1] * image_dims[2]));
      std::vector<uint8_t> label_bytes = idx_bytes(0x801, {labels}, 0);
      for (uint32_t i = 0; i < labels; ++i) label_bytes.push_back(i + 1 == labels ? top_label : uint8_t(i % 10));
      write_gzip(d + "/" + prefix + "-labels-idx1-ubyte.gz", label_bytes);
    }
    DataSection data;
    data.name = "fashion-mnist";
    data.path = d;
    try {
      validate_data_files(data);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(folder("good", {20, 28, 28}, 9, 20), "");
  EXPECT_NE(folder("wide", {20, 14, 56}, 9, 20).find("train images are 14 x 56; the models take 28 x 28"),
            std::string::npos);
  EXPECT_NE(folder("labels", {20, 28, 28}, 12, 20).find("train labels hold 12; Fashion-MNIST has classes 0 to 9"),
            std::string::npos);
  EXPECT_NE(folder("count", {20, 28, 28}, 9, 19).find("train images (20) and labels (19) differ in count"),
            std::string::npos);
}

TEST(FashionMnist, LoadsDebiansFilesNormalised) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is not installed (dataset-fashion-mnist)";
  TrainTestData data = load_fashion_mnist(dir);
  EXPECT_EQ(data.train.size(), 60000);
  EXPECT_EQ(data.test.size(), 10000);
  EXPECT_EQ(data.train.inputs.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_NEAR(data.train.inputs.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(data.train.inputs.std().item<double>(), 1.0, 0.01);
  EXPECT_EQ(data.train.targets.min().item<int64_t>(), 0);
  EXPECT_EQ(data.train.targets.max().item<int64_t>(), 9);
}

TEST(Synthetic, SameSeedSameDataAndMissingShare) {
  auto a = make_synthetic(1000, 3, 0.25), b = make_synthetic(1000, 3, 0.25);
  EXPECT_TRUE(a.train.inputs.equal(b.train.inputs));
  EXPECT_TRUE(a.train.targets.equal(b.train.targets));
  double missing = a.train.targets.lt(0).sum().item<double>() / 1000.0;
  EXPECT_NEAR(missing, 0.25, 0.05);
}

}  // namespace
}  // namespace lockstep
