#include "runtime/data/arrays.h"

#include <sys/stat.h>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/data/npy.h"
#include "runtime/base/errors.h"

namespace lockstep {
namespace {

bool is_folder(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> out;
  for (const auto& item : split_names(text)) out.push_back(std::stod(item));
  return out;
}

struct Pair {
  LoadedArray x, y;
};

Pair read_pair(const DataSection& data, const std::string& path, const std::string& key) {
  Pair pair;
  if (is_folder(path)) {
    pair.x = load_npy(path + "/" + data.inputs_key + ".npy");
    pair.y = load_npy(path + "/" + data.targets_key + ".npy");
  } else {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0)
      throw InputError(key + " = " + path + ": no such file or folder (an .npz written by "
                       "numpy.savez, or a folder holding " + data.inputs_key + ".npy and " +
                       data.targets_key + ".npy)");
    pair.x = load_npz_member(path, data.inputs_key);
    pair.y = load_npz_member(path, data.targets_key);
  }
  for (const LoadedArray* array : {&pair.x, &pair.y})
    if (!array->mapped)
      spdlog::info("Decision: data_in_memory = {} ({:.1f} MiB) (stored deflated, by "
                   "numpy.savez_compressed: inflated once; uncompressed arrays are read row by "
                   "row as batches need them)", array->where, double(array->bytes) / (1 << 20));
  if (pair.x.tensor.size(0) != pair.y.tensor.size(0))
    throw InputError(key + " = " + path + ": " + pair.x.where + " has " +
                     std::to_string(pair.x.tensor.size(0)) + " rows but " + pair.y.where + " has " +
                     std::to_string(pair.y.tensor.size(0)) + "; one target row per input row");
  if (pair.x.tensor.size(0) == 0) throw InputError(key + " = " + path + ": " + pair.x.where + " has no rows");
  return pair;
}

Dataset to_dataset(const DataSection& data, Pair pair) {
  Dataset set;
  set.inputs = pair.x.tensor;  // as stored: converted per batch
  set.reader = pair.x.reader;
  const at::Tensor& y = pair.y.tensor;
  set.targets = at::isIntegralType(y.scalar_type(), /*includeBool=*/false) ? y.to(at::kLong)
                                                                          : y.to(at::kFloat);
  set.transform.scale = data.scale;
  set.transform.mean = numbers(data.mean);
  set.transform.std = numbers(data.std);
  const int64_t channels = set.inputs.dim() >= 2 ? set.inputs.size(1) : 1;
  for (const auto* values : {&set.transform.mean, &set.transform.std})
    if (values->size() > 1 && int64_t(values->size()) != channels)
      throw InputError(std::string(values == &set.transform.mean ? "data.mean" : "data.std") + " has " +
                       std::to_string(values->size()) + " values but " + pair.x.where + " has " +
                       std::to_string(channels) + " channels (dimension 1 of " +
                       c10::str(set.inputs.sizes()) + "); give one per channel, or one for all");
  return set;
}

}  // namespace

Dataset load_arrays_file(const DataSection& data, const std::string& path, const std::string& key) {
  return to_dataset(data, read_pair(data, path, key));
}

std::vector<std::string> array_files(const DataSection& data) {
  std::vector<std::string> files;
  std::vector<std::string> paths = {data.train, data.test};
  if (!data.validation.empty() && data.validation.find_first_not_of("0123456789.eE+-") != std::string::npos)
    paths.push_back(data.validation);
  for (const std::string& path : paths) {
    if (is_folder(path)) {
      files.push_back(path + "/" + data.inputs_key + ".npy");
      files.push_back(path + "/" + data.targets_key + ".npy");
    } else {
      files.push_back(path);
    }
  }
  return files;
}

TrainTestData load_arrays(const DataSection& data) {
  TrainTestData out;
  Pair train = read_pair(data, data.train, "data.train");
  Pair test = read_pair(data, data.test, "data.test");
  if (train.x.tensor.sizes().slice(1) != test.x.tensor.sizes().slice(1))
    throw InputError("data.train inputs are " + c10::str(train.x.tensor.sizes()) + " (" + train.x.where +
                     ") but data.test inputs are " + c10::str(test.x.tensor.sizes()) + " (" + test.x.where +
                     "): the same shape per sample is needed");
  if (train.x.tensor.scalar_type() == at::kByte && data.scale == 1.0)
    spdlog::warn("Decision: data.scale = 1 ({} is uint8: values 0..255 reach the model as they are; "
                 "data.scale = 0.00392156862745098 gives 0..1)", train.x.where);
  const std::string x_type = c10::toString(train.x.tensor.scalar_type());
  out.description = "arrays: train " + train.x.where + " " + x_type + " " + c10::str(train.x.tensor.sizes()) +
                    ", targets " + c10::str(train.y.tensor.sizes()) + " " +
                    std::string(c10::toString(train.y.tensor.scalar_type())) + "; test " +
                    std::to_string(test.x.tensor.size(0)) + " rows";
  out.train = to_dataset(data, std::move(train));
  out.test = to_dataset(data, std::move(test));
  out.files = array_files(data);
  return out;
}

}  // namespace lockstep
