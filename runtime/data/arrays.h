#pragma once
// data.name = "arrays": inputs and targets from numpy. data.train and
// data.test each name an .npz (numpy.savez or savez_compressed; arrays
// data.inputs_key and data.targets_key, default x and y) or a folder
// holding x.npy and y.npy. Inputs stay as stored (memory-mapped where the
// bytes are stored uncompressed) and become float32 per batch: times
// data.scale, then minus data.mean and over data.std per channel. Targets:
// integers become int64 classes (-1 missing), floats and bool float32
// values (NaN missing). Every choice that is not the user's is logged.
#include <string>
#include <vector>

#include "runtime/job/config.h"
#include "runtime/data/dataset.h"

namespace lockstep {

// Throws InputError naming the file, the array and what was found.
TrainTestData load_arrays(const DataSection& data);

// One set from an .npz or folder (`key` names the setting, for messages).
Dataset load_arrays_file(const DataSection& data, const std::string& path, const std::string& key);

// The files data.train and data.test name (the .npz, or the two .npy).
std::vector<std::string> array_files(const DataSection& data);

}  // namespace lockstep
