#include "runtime/data/images.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/data/image_files.h"
#include "runtime/base/errors.h"
#include "runtime/base/printable.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// Runs task(i) for i in [0, count): on the calling thread and up to
// threads - 1 more. Calls may come from several threads at once.
class DecodePool {
 public:
  void resize(int threads) {
    stop();
    stopping_ = false;
    for (int i = 1; i < threads; ++i) threads_.emplace_back([this] { serve(); });
  }
  ~DecodePool() { stop(); }

  void for_each(int64_t count, const std::function<void(int64_t)>& task) {
    auto job = std::make_shared<Job>();
    job->count = count;
    job->task = &task;
    if (!threads_.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(job);
      wake_.notify_all();
    }
    work_on(*job);
    std::unique_lock<std::mutex> lock(job->mutex);
    job->finished.wait(lock, [&] { return job->done == job->count; });
    if (job->failure) std::rethrow_exception(job->failure);
  }

 private:
  struct Job {
    int64_t count = 0;
    const std::function<void(int64_t)>* task = nullptr;
    std::atomic<int64_t> next{0};
    std::mutex mutex;
    std::condition_variable finished;
    int64_t done = 0;                // guarded by mutex
    std::exception_ptr failure;      // guarded by mutex
  };

  static void work_on(Job& job) {
    for (int64_t i; (i = job.next.fetch_add(1)) < job.count;) {
      std::exception_ptr failure;
      try {
        (*job.task)(i);
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(job.mutex);
      if (failure && !job.failure) job.failure = failure;
      if (++job.done == job.count) job.finished.notify_all();
    }
  }

  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      std::shared_ptr<Job> job = jobs_.front();
      if (job->next.load() >= job->count) {  // all handed out: no longer anyone's to take
        jobs_.pop_front();
        continue;
      }
      lock.unlock();
      work_on(*job);
      lock.lock();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      wake_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  std::vector<std::thread> threads_;
};

// Image files as rows: decoded, converted and resized when asked for.
class ImageSource : public RowSource {
 public:
  ImageSource(std::vector<std::string> files, int channels, int64_t height, int64_t width, bool skip_bad)
      : files_(std::move(files)), channels_(channels), height_(height), width_(width), skip_bad_(skip_bad) {}

  at::Tensor read(const at::Tensor& rows, std::vector<int64_t>* unreadable) const override {
    const int64_t n = rows.numel();
    at::Tensor out = torch::zeros({n, channels_, height_, width_}, torch::kFloat);
    const at::Tensor index = rows.to(torch::kLong).contiguous();
    const int64_t* row = index.data_ptr<int64_t>();
    std::vector<char> failed(size_t(n), 0);
    pool_.for_each(n, [&](int64_t i) {
      const std::string& path = files_.at(size_t(row[i]));
      try {
        out[i].copy_(decode(path));
      } catch (const DecodeFailure& e) {
        if (!skip_bad_)
          throw InputError(path + ": does not decode (" + e.what() + "); remove it, or set "
                           "data.bad_files = skip to train without it");
        failed[size_t(i)] = 1;
        const int64_t so_far = ++unreadable_;
        if (so_far <= 10)
          spdlog::warn("{}: does not decode ({}); skipped (data.bad_files = skip): its target counts as "
                       "missing{}", path, e.what(), so_far == 10 ? "; further ones are counted, not logged" : "");
      }
    });
    for (int64_t i = 0; i < n; ++i)
      if (failed[size_t(i)] && unreadable) unreadable->push_back(i);
    return out;
  }

  int64_t unreadable_count() const override { return unreadable_.load(); }
  void set_threads(int threads) override { pool_.resize(threads); }

 private:
  at::Tensor decode(const std::string& path) const {
    std::string bytes;
    try {
      bytes = read_whole(path);
    } catch (const InputError& e) {
      throw DecodeFailure(e.what());
    }
    const bool png = starts_as_png(bytes);
    at::Tensor pixels = png ? decode_png(bytes, channels_) : decode_jpeg(bytes, channels_);
    if (pixels.size(0) != channels_) pixels = pixels.expand({channels_, pixels.size(1), pixels.size(2)});
    at::Tensor image = pixels.to(torch::kFloat);
    if (image.size(1) != height_ || image.size(2) != width_)
      image = at::_upsample_bilinear2d_aa(image.unsqueeze(0), {height_, width_}, false).squeeze(0).clamp_(0, 255);
    return image;
  }

  const std::vector<std::string> files_;
  const int channels_;
  const int64_t height_, width_;
  const bool skip_bad_;
  mutable DecodePool pool_;
  mutable std::atomic<int64_t> unreadable_{0};
};

struct Listing {
  std::vector<std::string> files;
  std::vector<int64_t> labels;
  std::vector<ImageHeader> headers;
  std::vector<std::string> bad;  // "file: why"
  int64_t ignored = 0;           // files with other extensions
};

// Whether `text` is valid UTF-8 (no overlong forms, no surrogates).
bool valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || length > text.size() - i) return false;
    uint32_t code = length == 1 ? c : c & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 2) return false;
      code = code << 6 | (next & 0x3f);
    }
    const uint32_t lowest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < lowest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

std::vector<std::string> class_folders(const std::string& folder, const std::string& key) {
  std::error_code error;
  if (!fs::is_directory(folder, error))
    throw InputError(key + " = " + folder + ": no such folder (data.name = images expects a folder "
                     "with one sub-folder of images per class)");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder, error))
    if (entry.is_directory() && entry.path().filename().string()[0] != '.')
      names.push_back(entry.path().filename().string());
  if (error) throw InputError(key + " = " + folder + ": cannot list (" + error.message() + ")");
  for (const auto& name : names)
    if (!valid_utf8(name))
      throw InputError(key + " = " + folder + ": class folder '" + printable(name) + "' is not a UTF-8 name "
                       "(class names go into the manifest and the report as text); rename it");
  std::sort(names.begin(), names.end());
  if (names.empty())
    throw InputError(key + " = " + folder + ": holds no sub-folders; data.name = images expects one "
                     "sub-folder per class (" + folder + "/cat/1.png, " + folder + "/dog/2.jpg, ...)");
  return names;
}

// Every image under `folder`/CLASS, labelled by its class's index in
// `classes`; the headers checked on `threads` threads.
Listing list_images(const std::string& folder, const std::string& key, const std::vector<std::string>& found,
                    const std::vector<std::string>& classes) {
  Listing out;
  for (const auto& name : found) {
    const auto at = std::find(classes.begin(), classes.end(), name);
    if (at == classes.end())
      throw InputError(key + " = " + folder + ": class folder '" + name + "' is not among the training "
                       "set's classes (" + std::to_string(classes.size()) + ": " + classes.front() + ", ...); "
                       "every split needs the same class folders");
    // torchvision's order: directories by path, files by name within each.
    std::vector<std::pair<std::string, std::string>> files;
    std::error_code error;
    const fs::path root = fs::path(folder) / name;
    // Links to folders are followed, so a link back up would list the same
    // files again and again: every folder is entered once, by its identity.
    std::map<std::pair<dev_t, ino_t>, std::string> entered;
    auto enter = [&](const fs::path& dir) {
      struct stat info {};
      if (::stat(dir.c_str(), &info) != 0) return;
      const auto [first, fresh] = entered.emplace(std::make_pair(info.st_dev, info.st_ino), dir.string());
      if (!fresh)
        throw InputError(dir.string() + ": is the folder " + first->second + " again (a link loop, or a folder "
                         "linked twice): its images would be listed more than once; remove the link");
    };
    enter(root);
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::follow_directory_symlink, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      if (error) break;
      std::error_code kind;
      if (it->is_directory(kind)) {
        enter(it->path());
        continue;
      }
      if (!it->is_regular_file(kind)) continue;
      if (!is_image_name(it->path())) {
        ++out.ignored;
        continue;
      }
      files.emplace_back(it->path().parent_path().string(), it->path().filename().string());
    }
    if (error) throw InputError(root.string() + ": cannot list (" + error.message() + ")");
    if (files.empty())
      throw InputError(root.string() + ": class folder without any .png, .jpg or .jpeg file; remove "
                       "it or add its images");
    std::sort(files.begin(), files.end());
    for (const auto& [dir, file] : files) {
      out.files.push_back(dir + "/" + file);
      out.labels.push_back(int64_t(at - classes.begin()));
    }
  }
  out.headers.resize(out.files.size());
  std::vector<std::string> problems(out.files.size());
  const int threads = int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < out.files.size();)
        problems[i] = check_image_file(out.files[i], &out.headers[i]);
    });
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < problems.size(); ++i)
    if (!problems[i].empty()) out.bad.push_back(out.files[i] + ": " + problems[i]);
  return out;
}

struct Shape {
  int channels = 0;
  int64_t height = 0, width = 0;
};

// Leaves the bad files out (skip) or throws naming them (error).
void settle_bad_files(const DataSection& data, const std::string& key, Listing& listing,
                      std::vector<std::string>* skipped) {
  if (listing.bad.empty()) return;
  if (data.bad_files != "skip")
    throw InputError(listing.bad.front() + (listing.bad.size() > 1 ? " (and " + std::to_string(listing.bad.size() - 1) +
                                                                         " more file(s) in " + key + ")"
                                                                   : std::string()) +
                     "; remove it, or set data.bad_files = skip to train without it");
  Listing kept;
  kept.ignored = listing.ignored;
  size_t b = 0;
  for (size_t i = 0; i < listing.files.size(); ++i) {
    if (b < listing.bad.size() && listing.bad[b].compare(0, listing.files[i].size() + 2, listing.files[i] + ": ") == 0) {
      ++b;
      continue;
    }
    kept.files.push_back(listing.files[i]);
    kept.labels.push_back(listing.labels[i]);
    kept.headers.push_back(listing.headers[i]);
  }
  spdlog::warn("{}: {} file(s) skipped (data.bad_files = skip): {}{}", key, listing.bad.size(), listing.bad.front(),
               listing.bad.size() > 1 ? ", ..." : "");
  for (const auto& line : listing.bad) skipped->push_back(line);
  listing = std::move(kept);
  if (listing.files.empty()) throw InputError(key + ": no image decodes; nothing to train on");
}

Dataset make_dataset(const Listing& listing, const Shape& shape, const DataSection& data) {
  Dataset set;
  set.reader = std::make_shared<ImageSource>(listing.files, shape.channels, shape.height, shape.width,
                                             data.bad_files == "skip");
  // A stand-in with the rows' shape and no storage: rows come through the reader.
  set.inputs = torch::zeros({1}, torch::kUInt8).expand({int64_t(listing.files.size()), shape.channels,
                                                        shape.height, shape.width});
  set.targets = torch::tensor(listing.labels, torch::kLong);
  set.transform.scale = data.scale;
  for (const auto& v : split_names(data.mean)) set.transform.mean.push_back(std::stod(v));
  for (const auto& v : split_names(data.std)) set.transform.std.push_back(std::stod(v));
  return set;
}

Shape decide_shape(const DataSection& data, const Listing& train) {
  Shape shape;
  const ImageHeader& first = train.headers.front();
  const std::string& first_file = train.files.front();
  ImageHeader known = first;
  if (known.width == 0) {  // a JPEG whose frame header is far in: decode it once
    const std::string bytes = read_whole(first_file);
    try {
      at::Tensor pixels = decode_jpeg(bytes, 3);
      known.height = pixels.size(1);
      known.width = pixels.size(2);
    } catch (const DecodeFailure& e) {
      throw InputError(first_file + ": does not decode (" + e.what() + ")");
    }
  }
  if (data.channels > 0) {
    shape.channels = int(data.channels);
  } else {
    shape.channels = known.colour ? 3 : 1;
    spdlog::info("Decision: data.channels = {} ({} {} is {}; set data.channels to choose)", shape.channels,
                 "the first training image", first_file, known.colour ? "colour" : "grey");
  }
  const auto sizes = split_names(data.image_size);
  if (sizes.empty()) {
    shape.height = known.height;
    shape.width = known.width;
    spdlog::info("Decision: data.image_size = {},{} (height, width of the first training image {}; "
                 "every image is resized to it; set data.image_size to choose)", shape.height, shape.width,
                 first_file);
  } else {
    shape.height = std::stol(sizes[0]);
    shape.width = std::stol(sizes.size() > 1 ? sizes[1] : sizes[0]);
  }
  return shape;
}

std::string shape_text(const Shape& shape) {
  return fmt::format("{} x {} x {}", shape.channels, shape.height, shape.width);
}

// How many images differ from `shape` in size: they are resized, which is said.
void note_resizing(const std::string& key, const Listing& listing, const Shape& shape) {
  int64_t other = 0;
  for (const auto& h : listing.headers)
    if (h.width != 0 && (h.width != shape.width || h.height != shape.height)) ++other;
  if (other > 0)
    spdlog::info("Decision: resize = {} image(s) of {} ({} of {} differ from {} x {}; bilinear, antialiased)",
                 other, key, other, listing.files.size(), shape.height, shape.width);
}

}  // namespace

TrainTestData load_image_folders(const DataSection& data) {
  const std::vector<std::string> classes = class_folders(data.train, "data.train");
  TrainTestData out;
  Listing train = list_images(data.train, "data.train", classes, classes);
  Listing test = list_images(data.test, "data.test", class_folders(data.test, "data.test"), classes);
  settle_bad_files(data, "data.train", train, &out.bad_files);
  settle_bad_files(data, "data.test", test, &out.bad_files);
  const Shape shape = decide_shape(data, train);
  note_resizing("data.train", train, shape);
  note_resizing("data.test", test, shape);
  if (train.ignored + test.ignored > 0)
    spdlog::info("Decision: ignored_files = {} (names not ending in .png, .jpg or .jpeg under data.train and "
                 "data.test)", train.ignored + test.ignored);
  std::string class_list;
  for (size_t i = 0; i < classes.size(); ++i)
    class_list += (i ? ", " : "") + std::to_string(i) + " " + classes[i];
  spdlog::info("Decision: classes = {} ({}; sub-folders of {} sorted by name, as torchvision's ImageFolder)",
               classes.size(), class_list, data.train);
  out.train = make_dataset(train, shape, data);
  out.test = make_dataset(test, shape, data);
  out.classes = classes;
  out.folders = {{data.train, train.files}, {data.test, test.files}};
  out.description = fmt::format("images: train {} ({} images), test {} ({} images), {} classes, {} as "
                                "float32 times {:g}{}", data.train, train.files.size(), data.test,
                                test.files.size(), classes.size(), shape_text(shape), data.scale,
                                data.mean.empty() ? "" : ", normalised by data.mean / data.std");
  if (!out.bad_files.empty()) out.description += fmt::format("; {} bad file(s) skipped", out.bad_files.size());
  return out;
}

Dataset load_image_folder_like(const DataSection& data, const std::string& folder, TrainTestData& trained) {
  Listing listing = list_images(folder, "data.validation", class_folders(folder, "data.validation"), trained.classes);
  settle_bad_files(data, "data.validation", listing, &trained.bad_files);
  trained.folders.emplace_back(folder, listing.files);
  Shape shape;
  shape.channels = int(trained.train.inputs.size(1));
  shape.height = trained.train.inputs.size(2);
  shape.width = trained.train.inputs.size(3);
  note_resizing("data.validation", listing, shape);
  return make_dataset(listing, shape, data);
}

}  // namespace lockstep
