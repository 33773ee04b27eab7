#include "runtime/data/provenance.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

// Streamed through a small buffer, not mapped: a mapping would count the
// whole file in this rank's resident set while it is hashed.
std::string file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(size_t(1) << 20);
  bool failed = false;
  for (;;) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) failed = true;
    if (got <= 0) break;
    XXH3_64bits_update(state, buffer.data(), size_t(got));
  }
  ::close(fd);
  const XXH64_hash_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return failed ? "" : fmt::format("{:016x}", hash);
}

}  // namespace

namespace {

class DigestCache {
 public:
  DigestCache() : path_(cache_folder() + "/data-digests.json") {
    try {
      if (std::filesystem::exists(path_)) {
        std::string why;
        auto parsed = parse_untrusted_json(read_text_file(path_, "the data digest cache", 16 << 20), &why);
        if (why.empty() && parsed.is_object()) entries_ = parsed;
      }
    } catch (const std::exception& e) {
      spdlog::warn("the data digest cache {} cannot be read ({}); digests are computed again", path_, e.what());
    }
  }
  ~DigestCache() {
    if (!changed_) return;
    try {
      std::filesystem::create_directories(cache_folder());
      write_file_atomically(path_, entries_.dump(1));
    } catch (const std::exception& e) {
      spdlog::warn("the data digests could not be cached in {} ({}): the next start hashes the files "
                   "again", path_, e.what());
    }
  }
  // The digest kept for `key` when it was computed for the same `version`; "" if none.
  std::string find(const std::string& key, const nlohmann::json& version) const {
    if (!entries_.contains(key)) return "";
    const auto& known = entries_[key];
    if (!known.is_object() || known.value("version", nlohmann::json()) != version || !known.contains("xxh3") ||
        !known["xxh3"].is_string())
      return "";
    return known["xxh3"].get<std::string>();
  }
  void keep(const std::string& key, const nlohmann::json& version, const std::string& digest) {
    entries_[key] = {{"version", version}, {"xxh3", digest}};
    changed_ = true;
  }

 private:
  std::string path_;
  nlohmann::json entries_ = nlohmann::json::object();
  bool changed_ = false;
};

int64_t mtime_ns(const struct stat& info) {
  return int64_t(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
}

std::string absolute_path(const std::string& file) {
  std::error_code error;
  return std::filesystem::absolute(file, error).lexically_normal().string();
}

}  // namespace

nlohmann::json data_provenance(const std::vector<std::string>& files) {
  DigestCache cache;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& file : files) {
    const std::string path = absolute_path(file);
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) continue;
    const nlohmann::json version = {int64_t(info.st_size), mtime_ns(info)};
    nlohmann::json entry = {{"path", path}, {"bytes", int64_t(info.st_size)},
                            {"modified", utc_timestamp(info.st_mtim.tv_sec)}};
    std::string digest = cache.find(path, version);
    entry["digest_cached"] = !digest.empty();
    if (digest.empty()) {
      digest = file_digest(path);
      cache.keep(path, version, digest);
    }
    entry["xxh3"] = digest;
    out.push_back(entry);
  }
  return out;
}

nlohmann::json folder_provenance(const std::string& folder, const std::vector<std::string>& files) {
  DigestCache cache;
  const std::string root = absolute_path(folder);
  // The listing (names, sizes, times) says whether a kept digest still holds.
  XXH3_state_t* listing = XXH3_createState();
  XXH3_64bits_reset(listing);
  int64_t bytes = 0;
  time_t newest = 0;
  for (const auto& file : files) {
    struct stat info {};
    if (::stat(file.c_str(), &info) != 0) info = {};
    const int64_t facts[2] = {int64_t(info.st_size), mtime_ns(info)};
    XXH3_64bits_update(listing, file.data(), file.size() + 1);
    XXH3_64bits_update(listing, facts, sizeof facts);
    bytes += info.st_size;
    newest = std::max(newest, info.st_mtim.tv_sec);
  }
  const std::string listed = fmt::format("{:016x}", XXH3_64bits_digest(listing));
  XXH3_freeState(listing);
  const std::string key = "folder " + root;
  std::string digest = cache.find(key, listed);
  nlohmann::json entry = {{"path", root}, {"files", int64_t(files.size())}, {"bytes", bytes},
                          {"modified", utc_timestamp(newest)}, {"digest_cached", !digest.empty()},
                          {"digest_of", "each file's path below the folder, then its xxh3, in order"}};
  if (digest.empty()) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const auto& file : files) {
      const std::string below = std::filesystem::path(file).lexically_relative(folder).string();
      const std::string one = file_digest(file);
      XXH3_64bits_update(state, below.data(), below.size() + 1);
      XXH3_64bits_update(state, one.data(), one.size() + 1);
    }
    digest = fmt::format("{:016x}", XXH3_64bits_digest(state));
    XXH3_freeState(state);
    cache.keep(key, listed, digest);
  }
  entry["xxh3"] = digest;
  return entry;
}

}  // namespace lockstep
