#include "runtime/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <spdlog/fmt/fmt.h>
#include <torch/torch.h>

#include "runtime/errors.h"

namespace lockstep {
namespace {

// Fashion-MNIST training-set mean and standard deviation of pixel / 255.
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

std::vector<uint8_t> read_gzip(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw InputError(path + ": file not found (data.path must hold the Fashion-MNIST IDX .gz "
                            "files; Debian's dataset-fashion-mnist installs them under "
                            "/usr/share/datasets/fashion-mnist)");
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw InputError(path + ": cannot open for reading");
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(file, chunk.data(), unsigned(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      throw InputError(path + ": corrupt or truncated gzip data (" + message + ")");
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  int code = 0;
  const char* message = gzerror(file, &code);
  std::string error_text = message ? message : "";
  gzclose(file);
  if (code != Z_OK && code != Z_STREAM_END)
    throw InputError(path + ": corrupt or truncated gzip data (" + error_text + ")");
  return bytes;
}

uint32_t big_endian(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

}  // namespace

at::Tensor read_idx_gz(const std::string& path, int expected_dims) {
  std::vector<uint8_t> bytes = read_gzip(path);
  const uint32_t expected_magic = 0x00000800u | uint32_t(expected_dims);
  char expected_hex[16];
  std::snprintf(expected_hex, sizeof expected_hex, "0x%08x", expected_magic);
  if (bytes.size() < 4)
    throw InputError(path + ": too short to be an IDX file (" + std::to_string(bytes.size()) +
                     " bytes)");
  uint32_t magic = big_endian(bytes.data());
  if (magic != expected_magic) {
    char got[16];
    std::snprintf(got, sizeof got, "0x%08x", magic);
    throw InputError(path + ": not an IDX file of unsigned bytes with " +
                     std::to_string(expected_dims) + " dimensions (magic " + got + ", expected " +
                     expected_hex + ")");
  }
  size_t header = 4 + 4 * size_t(expected_dims);
  if (bytes.size() < header)
    throw InputError(path + ": truncated IDX header");
  std::vector<int64_t> shape;
  size_t expected_bytes = 1;
  for (int d = 0; d < expected_dims; ++d) {
    shape.push_back(big_endian(bytes.data() + 4 + 4 * d));
    expected_bytes *= size_t(shape.back());
  }
  if (bytes.size() - header != expected_bytes)
    throw InputError(path + ": " + (bytes.size() - header < expected_bytes ? "truncated" : "too long") +
                     ": the header promises " + std::to_string(expected_bytes) +
                     " bytes of data, the file holds " + std::to_string(bytes.size() - header));
  auto tensor = torch::empty(shape, torch::kUInt8);
  std::memcpy(tensor.data_ptr<uint8_t>(), bytes.data() + header, expected_bytes);
  return tensor;
}

TrainTestData load_fashion_mnist(const std::string& dir) {
  check_data_files(DataSection{"fashion-mnist", dir});
  auto load = [&](const std::string& prefix) {
    at::Tensor raw_images = read_idx_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", 3);
    at::Tensor raw_labels = read_idx_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", 1);
    if (raw_images.size(0) != raw_labels.size(0))
      throw InputError(dir + ": " + prefix + " images (" + std::to_string(raw_images.size(0)) +
                       ") and labels (" + std::to_string(raw_labels.size(0)) + ") differ in count");
    Dataset set;
    set.images = raw_images.to(torch::kFloat32)
                     .div_(255.0)
                     .sub_(kFashionMean)
                     .div_(kFashionStd)
                     .unsqueeze(1)
                     .contiguous();
    set.labels = raw_labels.to(torch::kInt64);
    return set;
  };
  TrainTestData data{load("train"), load("t10k"), ""};
  data.description = "fashion-mnist from " + dir + " (" + std::to_string(data.train.size()) +
                     " train, " + std::to_string(data.test.size()) + " test)";
  return data;
}

TrainTestData make_synthetic(int64_t train_samples, uint64_t seed, double missing_share) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5eed5eedULL);
  const int64_t test_samples = std::max<int64_t>(256, train_samples / 8);
  auto teacher = at::normal(0.0, 1.0, {28 * 28, 10}, generator);
  auto make = [&](int64_t n) {
    Dataset set;
    set.images = at::normal(0.0, 1.0, {n, 1, 28, 28}, generator);
    set.labels = set.images.reshape({n, 28 * 28}).matmul(teacher).argmax(1);
    return set;
  };
  TrainTestData data{make(train_samples), make(test_samples), ""};
  if (missing_share > 0) {
    auto drop = at::empty({train_samples}).uniform_(0.0, 1.0, generator) < missing_share;
    data.train.labels.masked_fill_(drop, -1);
  }
  data.description = "synthetic (" + std::to_string(train_samples) + " train, " +
                     std::to_string(test_samples) + " test, missing targets " +
                     fmt::format("{:g}", missing_share) + ")";
  return data;
}

void check_data_files(const DataSection& data) {
  if (data.name != "fashion-mnist") return;
  struct stat info {};
  if (::stat(data.path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw InputError("data.path = " + data.path + ": no such folder (install Debian's "
                     "dataset-fashion-mnist, or point data.path at a folder with the IDX .gz files)");
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    std::string file = data.path + "/" + name;
    if (::stat(file.c_str(), &info) != 0)
      throw InputError("data.path = " + data.path + ": missing " + name);
  }
}

void validate_data_files(const DataSection& data) {
  check_data_files(data);
  if (data.name != "fashion-mnist") return;
  for (const char* prefix : {"train", "t10k"}) {
    read_idx_gz(data.path + "/" + prefix + "-images-idx3-ubyte.gz", 3);
    read_idx_gz(data.path + "/" + prefix + "-labels-idx1-ubyte.gz", 1);
  }
}

TrainTestData load_data(const DataSection& data, uint64_t seed) {
  if (data.name == "synthetic")
    return make_synthetic(data.synthetic_samples, seed, data.missing_targets);
  return load_fashion_mnist(data.path);
}

}  // namespace lockstep
