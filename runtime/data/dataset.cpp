#include "runtime/data/dataset.h"

#include <sys/stat.h>
#include <algorithm>
#include <limits>
#include <zlib.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/data/arrays.h"
#include "runtime/data/images.h"
#include "runtime/data/npy.h"
#include "runtime/data/sampler.h"

namespace lockstep {
namespace {

// Fashion-MNIST training-set mean and standard deviation of pixel / 255.
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

uint32_t big_endian(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

}  // namespace

at::Tensor read_idx_gz(const std::string& path, int expected_dims) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw InputError(path + ": file not found (data.path must hold the Fashion-MNIST IDX .gz "
                            "files; Debian's dataset-fashion-mnist installs them under "
                            "/usr/share/datasets/fashion-mnist)");
  if (!S_ISREG(info.st_mode))
    throw InputError(path + ": not a regular file (a folder, device or pipe); data files must be files");
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw InputError(path + ": cannot open for reading");
  struct Close {
    gzFile f;
    ~Close() { gzclose(f); }
  } close{file};
  // Reads exactly `n` bytes; false at the end of the data. Never more than
  // asked: the header says how much there is, and no more is inflated.
  auto read_exactly = [&](uint8_t* into, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned ask = unsigned(std::min<size_t>(n - done, 1u << 20));
      const int got = gzread(file, into + done, ask);
      if (got < 0) {
        int code = 0;
        throw InputError(path + ": corrupt or truncated gzip data (" + gzerror(file, &code) + ")");
      }
      if (got == 0) {
        int code = Z_OK;
        const char* message = gzerror(file, &code);
        if (code != Z_OK && code != Z_STREAM_END)  // the gzip stream itself is cut or damaged
          throw InputError(path + ": corrupt or truncated gzip data (" + (message ? message : "?") + ")");
        return false;
      }
      done += size_t(got);
    }
    return true;
  };
  const uint32_t expected_magic = 0x00000800u | uint32_t(expected_dims);
  char expected_hex[16];
  std::snprintf(expected_hex, sizeof expected_hex, "0x%08x", expected_magic);
  uint8_t header[4 + 4 * 3];
  if (!read_exactly(header, 4))
    throw InputError(path + ": too short to be an IDX file");
  const uint32_t magic = big_endian(header);
  if (magic != expected_magic) {
    char got[16];
    std::snprintf(got, sizeof got, "0x%08x", magic);
    throw InputError(path + ": not an IDX file of unsigned bytes with " + std::to_string(expected_dims) +
                     " dimensions (magic " + got + ", expected " + expected_hex + ")");
  }
  if (!read_exactly(header + 4, 4 * size_t(expected_dims))) throw InputError(path + ": truncated IDX header");
  // The promised size, checked against a bound before anything is
  // allocated: 2^31 x 2^31 x 4 must not wrap around to something small.
  constexpr uint64_t kMaxBytes = uint64_t(4) << 30;
  std::vector<int64_t> shape;
  uint64_t expected_bytes = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const uint64_t extent = big_endian(header + 4 + 4 * d);
    shape.push_back(int64_t(extent));
    if (extent != 0 && expected_bytes > kMaxBytes / extent)
      throw InputError(path + ": the header promises more than 4 GiB of data (shape " +
                       std::to_string(shape[0]) + (expected_dims > 1 ? " x ..." : "") + "); not a dataset this reads");
    expected_bytes *= extent;
  }
  if (shape[0] == 0) throw InputError(path + ": the header says it holds 0 items");
  auto tensor = torch::empty(shape, torch::kUInt8);
  if (!read_exactly(tensor.data_ptr<uint8_t>(), size_t(expected_bytes))) {
    throw InputError(path + ": truncated: the header promises " + std::to_string(expected_bytes) +
                     " bytes of data, the file holds fewer");
  }
  uint8_t extra = 0;
  if (read_exactly(&extra, 1))
    throw InputError(path + ": too long: the header promises " + std::to_string(expected_bytes) +
                     " bytes of data, the file holds more");
  return tensor;
}

namespace {

// Checks what the models can take: 28 x 28 images, labels 0..9, as many of
// each. Throws InputError naming the folder.
void check_images_and_labels(const std::string& dir, const std::string& prefix, const at::Tensor& images,
                             const at::Tensor& labels) {
  if (images.size(0) != labels.size(0))
    throw InputError(dir + ": " + prefix + " images (" + std::to_string(images.size(0)) + ") and labels (" +
                     std::to_string(labels.size(0)) + ") differ in count");
  if (images.size(1) != 28 || images.size(2) != 28)
    throw InputError(dir + ": " + prefix + " images are " + std::to_string(images.size(1)) + " x " +
                     std::to_string(images.size(2)) + "; the models take 28 x 28 (Fashion-MNIST)");
  const int64_t top = labels.max().item<int64_t>();
  if (top > 9)
    throw InputError(dir + ": " + prefix + " labels hold " + std::to_string(top) +
                     "; Fashion-MNIST has classes 0 to 9");
}

}  // namespace

TrainTestData load_fashion_mnist(const std::string& dir) {
  check_data_files(DataSection{"fashion-mnist", dir, {}, {}});
  auto load = [&](const std::string& prefix) {
    at::Tensor raw_images = read_idx_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", 3);
    at::Tensor raw_labels = read_idx_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", 1);
    check_images_and_labels(dir, prefix, raw_images, raw_labels);
    Dataset set;
    set.inputs = raw_images.to(torch::kFloat32)
                     .div_(255.0)
                     .sub_(kFashionMean)
                     .div_(kFashionStd)
                     .unsqueeze(1)
                     .contiguous();
    set.targets = raw_labels.to(torch::kInt64);
    return set;
  };
  TrainTestData data;
  data.train = load("train");
  data.test = load("t10k");
  data.description = "fashion-mnist from " + dir + " (" + std::to_string(data.train.size()) +
                     " train, " + std::to_string(data.test.size()) + " test)";
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    data.files.push_back(dir + "/" + name);
  return data;
}

TrainTestData make_synthetic(int64_t train_samples, uint64_t seed, double missing_share) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5eed5eedULL);
  const int64_t test_samples = std::max<int64_t>(256, train_samples / 8);
  // Ten class prototypes under noise: a short run shows its accuracy
  // climbing (the synthetic example's 40 steps on 2 ranks reach about 0.55).
  // Labels from a random linear teacher over 784 Gaussian inputs were not
  // learnable from 2,048 samples (0.14).
  constexpr double kPrototypeScale = 0.12;
  auto prototypes = at::normal(0.0, 1.0, {10, 1, 28, 28}, generator);
  auto make = [&](int64_t n) {
    Dataset set;
    set.targets = at::randint(0, 10, {n}, generator, at::kLong);
    set.inputs = prototypes.index_select(0, set.targets) * kPrototypeScale +
                 at::normal(0.0, 1.0, {n, 1, 28, 28}, generator);
    return set;
  };
  TrainTestData data;
  data.train = make(train_samples);
  data.test = make(test_samples);
  if (missing_share > 0) {
    auto drop = at::empty({train_samples}).uniform_(0.0, 1.0, generator) < missing_share;
    data.train.targets.masked_fill_(drop, -1);
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
  for (const char* prefix : {"train", "t10k"})
    check_images_and_labels(data.path, prefix, read_idx_gz(data.path + "/" + prefix + "-images-idx3-ubyte.gz", 3),
                            read_idx_gz(data.path + "/" + prefix + "-labels-idx1-ubyte.gz", 1));
}

at::Tensor InputTransform::apply(const at::Tensor& rows) const {
  at::Tensor out = rows.scalar_type() == at::kFloat ? rows : rows.to(at::kFloat);
  if (scale != 1.0) out = out * scale;
  auto per_channel = [&](const std::vector<double>& values) {
    std::vector<int64_t> shape(size_t(std::max<int64_t>(out.dim(), 2)), 1);
    shape[1] = int64_t(values.size());
    return torch::tensor(values, torch::kFloat).reshape(shape);
  };
  if (!mean.empty()) out = out - per_channel(mean);
  if (!std.empty()) out = out / per_channel(std);
  return out;
}

at::Tensor Dataset::input_rows(const at::Tensor& rows, std::vector<int64_t>* unreadable) const {
  const at::Tensor stored = row_map.defined() ? row_map.index_select(0, rows) : rows;
  return transform.apply(reader ? reader->read(stored, unreadable) : inputs.index_select(0, stored));
}

at::Tensor Dataset::target_rows(const at::Tensor& rows, const std::vector<int64_t>& unreadable) const {
  at::Tensor out = targets.index_select(0, rows);
  for (const int64_t position : unreadable) {
    if (out.is_floating_point()) out[position].fill_(std::numeric_limits<double>::quiet_NaN());
    else out[position].fill_(-1);
  }
  return out;
}

namespace {

// The distinct row sources (a split shares its source with the set it came from).
std::vector<RowSource*> distinct_readers(const TrainTestData& data) {
  std::vector<RowSource*> out;
  for (const Dataset* set : {&data.train, &data.test, &data.validation})
    if (set->reader && std::find(out.begin(), out.end(), set->reader.get()) == out.end())
      out.push_back(set->reader.get());
  return out;
}

}  // namespace

int64_t TrainTestData::unreadable_in_batches() const {
  int64_t total = 0;
  for (const RowSource* reader : distinct_readers(*this)) total += reader->unreadable_count();
  return total;
}

void TrainTestData::set_reader_threads(int threads) {
  for (RowSource* reader : distinct_readers(*this)) reader->set_threads(threads);
}

void split_validation(const DataSection& section, uint64_t seed, TrainTestData& data) {
  if (section.validation.empty()) return;
  size_t used = 0;
  double fraction = -1;
  try {
    fraction = std::stod(section.validation, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != section.validation.size()) {
    if (section.name != "arrays" && section.name != "images")
      throw InputError("data.validation = " + section.validation + ": a file or folder works with "
                       "data.name = arrays or images only; give a fraction such as 0.1");
    data.validation = section.name == "images"
                          ? load_image_folder_like(section, section.validation, data)
                          : load_arrays_file(section, section.validation, "data.validation");
    spdlog::info("Decision: validation = {} ({} samples; evaluated every eval.every steps, the test "
                 "set at the end)", section.validation, data.validation.size());
    return;
  }
  if (!(fraction > 0 && fraction < 1))
    throw InputError("data.validation = " + section.validation + ": a fraction between 0 and 1 "
                     "(exclusive), or a file or folder (arrays, images)");
  const int64_t total = data.train.size();
  const int64_t held = int64_t(std::llround(fraction * double(total)));
  if (held < 1 || held >= total)
    throw InputError("data.validation = " + section.validation + " of " + std::to_string(total) +
                     " training samples holds out " + std::to_string(held) + "; at least 1 and fewer "
                     "than all are needed");
  const std::vector<int64_t> order = DistributedSampler::permutation(total, seed ^ 0x7a11da7eULL, 0);
  auto pick = [&](int64_t from, int64_t count) {
    std::vector<int64_t> rows(order.begin() + from, order.begin() + from + count);
    std::sort(rows.begin(), rows.end());  // file order: reads stay near each other
    at::Tensor index = torch::tensor(rows, torch::kLong);
    Dataset part = data.train;
    part.targets = data.train.targets.index_select(0, index);
    part.row_map = data.train.row_map.defined() ? data.train.row_map.index_select(0, index) : index;
    return part;
  };
  Dataset train = pick(held, total - held);
  data.validation = pick(0, held);
  data.train = std::move(train);
  spdlog::info("Decision: validation = {} of the training set ({} of {} samples, a split seeded by "
               "job.seed, the same on every rank; evaluated every eval.every steps, the test set at "
               "the end)", section.validation, held, total);
  data.description += "; validation " + std::to_string(held) + " held out of " + std::to_string(total);
}

namespace {

// A step's global batch must fit in the training set (after a validation split).
void check_global_batch_fits(const DataSection& data, const TrainTestData& loaded) {
  const int64_t samples = loaded.train.size();
  if (data.global_batch > samples)
    throw InputError("data.global_batch = " + std::to_string(data.global_batch) + " is more than the " +
                     std::to_string(samples) + " training samples of " + loaded.description +
                     ": not one step fits in an epoch; use a global batch of at most " + std::to_string(samples) +
                     " (data.global_batch, or data.batch_size x train.accum_steps x job.world_size)");
}

TrainTestData load_checked(const DataSection& data, uint64_t seed) {
  if (data.name == "arrays" || data.name == "images") {
    TrainTestData out = data.name == "arrays" ? load_arrays(data) : load_image_folders(data);
    split_validation(data, seed, out);
    return out;
  }
  TrainTestData out = data.name == "synthetic"
                          ? make_synthetic(data.synthetic_samples, seed, data.missing_targets)
                          : load_fashion_mnist(data.path);
  split_validation(data, seed, out);
  return out;
}

}  // namespace

TrainTestData load_data(const DataSection& data, uint64_t seed) {
  TrainTestData out = load_checked(data, seed);
  check_global_batch_fits(data, out);
  return out;
}

}  // namespace lockstep
