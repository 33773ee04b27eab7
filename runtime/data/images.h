#pragma once
// data.name = "images": a folder per split (data.train, data.test, and
// data.validation when it names a folder) holding one sub-folder per class,
// the images inside it (.png, .jpg, .jpeg, any case, sub-folders included).
// Classes are the sub-folders sorted by name, class i the i-th name, files in
// path order: the indices torchvision's ImageFolder gives. Before anything
// starts, every file's header and end are checked (a truncated or foreign
// file is found now, not hours in); a file that fails is an InputError
// naming it, or with data.bad_files = skip is left out and counted. Images
// are decoded when their batch is assembled (libpng, libjpeg), on
// `set_threads` threads, converted to data.channels (grey, RGB) and resized
// to data.image_size; the first training image decides what is not set, and
// that is logged.
#include <string>
#include <vector>

#include "runtime/job/config.h"
#include "runtime/data/dataset.h"

namespace lockstep {

// Throws InputError naming the folder or file and the fix.
TrainTestData load_image_folders(const DataSection& data);

// A third folder with the training set's classes and image shape
// (data.validation); its files join `trained`'s folders and bad files.
Dataset load_image_folder_like(const DataSection& data, const std::string& folder, TrainTestData& trained);

}  // namespace lockstep
