#include "runtime/data/provenance.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "runtime/run_folder.h"
#include "runtime/untrusted_json.h"

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

nlohmann::json data_provenance(const std::vector<std::string>& files) {
  const std::string cache_path = cache_folder() + "/data-digests.json";
  nlohmann::json cache = nlohmann::json::object();
  try {
    if (std::filesystem::exists(cache_path)) {
      std::string why;
      auto parsed = parse_untrusted_json(read_text_file(cache_path, "the data digest cache", 16 << 20), &why);
      if (why.empty() && parsed.is_object()) cache = parsed;
    }
  } catch (const std::exception& e) {
    spdlog::warn("the data digest cache {} cannot be read ({}); digests are computed again", cache_path,
                 e.what());
  }
  nlohmann::json out = nlohmann::json::array();
  bool changed = false;
  for (const auto& file : files) {
    std::error_code error;
    const std::string path = std::filesystem::absolute(file, error).lexically_normal().string();
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) continue;
    const int64_t mtime_ns = int64_t(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
    nlohmann::json entry = {{"path", path}, {"bytes", int64_t(info.st_size)},
                            {"modified", utc_timestamp(info.st_mtim.tv_sec)}};
    const auto& known = cache.contains(path) ? cache[path] : nlohmann::json();
    if (known.is_object() && known.value("bytes", int64_t(-1)) == int64_t(info.st_size) &&
        known.value("mtime_ns", int64_t(-1)) == mtime_ns && known.contains("xxh3") && known["xxh3"].is_string()) {
      entry["xxh3"] = known["xxh3"];
      entry["digest_cached"] = true;
    } else {
      entry["xxh3"] = file_digest(path);
      entry["digest_cached"] = false;
      cache[path] = {{"bytes", int64_t(info.st_size)}, {"mtime_ns", mtime_ns}, {"xxh3", entry["xxh3"]}};
      changed = true;
    }
    out.push_back(entry);
  }
  if (changed) {
    try {
      std::filesystem::create_directories(cache_folder());
      write_file_atomically(cache_path, cache.dump(1));
    } catch (const std::exception& e) {
      spdlog::warn("the data digests could not be cached in {} ({}): the next start hashes the files "
                   "again", cache_path, e.what());
    }
  }
  return out;
}

}  // namespace lockstep
