#include "runtime/run/run_folder.h"

#include "runtime/run/tensorboard.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

#include "runtime/base/errors.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep {

std::string new_run_id(const std::string& job_name) {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  std::random_device device;
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, "%04x", device() & 0xffff);
  std::string name;
  for (char c : job_name) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  return name + "-" + stamp + "-" + suffix;
}

std::string random_hex(int bytes) {
  std::random_device device;
  std::string text;
  char pair[3];
  for (int i = 0; i < bytes; ++i) {
    std::snprintf(pair, sizeof pair, "%02x", device() & 0xff);
    text += pair;
  }
  return text;
}

std::string utc_timestamp(std::time_t when) {
  std::tm utc{};
  gmtime_r(&when, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  // One temporary per call: two threads of one process (a rank's training
  // thread and its heartbeat, both ending the run) may write the same file.
  static std::atomic<uint64_t> calls{0};
  const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(calls.fetch_add(1));
  // Any failure (a full disk shows at write, fsync or close) removes the
  // temporary and names the file that could not be written; the old file,
  // if any, stays as it was.
  auto fail = [&](int fd, int error) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    throw RunError("cannot write " + path + ": " + std::strerror(error));
  };
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(-1, errno);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(fd, errno);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) fail(fd, errno);
  if (::close(fd) != 0) fail(-1, errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw RunError("cannot rename " + temp + " to " + path + ": " + std::strerror(error));
  }
  std::string folder = std::filesystem::path(path).parent_path().string();
  int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  // Checked before opening: opening a FIFO would wait for a writer, and
  // /dev/zero never ends.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw InputError(what + " " + path + ": cannot read the file (" + std::strerror(errno) + ")");
  if (!S_ISREG(info.st_mode))
    throw InputError(what + " " + path + ": not a regular file (a folder, device or pipe); give a file");
  if (static_cast<uint64_t>(info.st_size) > max_bytes)
    throw InputError(what + " " + path + ": " + std::to_string(info.st_size) + " bytes, more than the " +
                     std::to_string(max_bytes) + " such a file may have");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(what + " " + path + ": cannot read the file");
  std::string text(max_bytes + 1 < size_t(info.st_size) + 1 ? max_bytes + 1 : size_t(info.st_size) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes)
    throw InputError(what + " " + path + ": grew past " + std::to_string(max_bytes) + " bytes while read");
  return text;
}

RunFolderLock::RunFolderLock(const std::string& folder) {
  std::error_code ignored;
  std::filesystem::create_directories(folder, ignored);
  const std::string path = folder + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw InputError("run folder " + folder + ": cannot open its lock " + path + " (" + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char owner[256] = {0};
    const ssize_t n = ::pread(fd_, owner, sizeof owner - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string holder = n > 0 ? std::string(owner, size_t(n)) : std::string("another process");
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (error == EWOULDBLOCK)
      throw InputError("run folder " + folder + " is in use: " + holder +
                       " is writing it; wait for that run to end (or stop it) before resuming it, or "
                       "choose another folder");
    throw InputError("run folder " + folder + ": cannot lock " + path + " (" + std::strerror(error) + ")");
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string("host ") + host + " pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    // The lock holds without the note; only the message for a second writer is poorer.
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

RunFolder::RunFolder(const std::string& root, const std::string& run_id)
    : path_(root + "/" + run_id), run_id_(run_id) {}

void RunFolder::create() const {
  std::error_code error;
  std::filesystem::create_directories(path_, error);
  if (error) throw RunError("cannot create run folder " + path_ + ": " + error.message());
}

namespace {

// A sudden end (the coordinator lost) is recorded by the heartbeat's thread
// while the training thread may still be unwinding and write its own
// failure: the reason stays with the process, and every manifest written
// after it carries it, whichever thread writes last.
std::mutex sudden_end_mutex;
std::string sudden_end_reason;  // guarded by sudden_end_mutex

nlohmann::json with_sudden_end(nlohmann::json manifest, const std::string& reason) {
  const auto status = manifest.find("status");
  if (status == manifest.end() || !status->is_string() || *status == "running") {
    manifest["status"] = "failed";
    manifest["error"] = reason;
  } else if (*status == "failed" && manifest.value("error", std::string()) != reason) {
    // This rank's training failed first (most often a peer that left for
    // the same reason): both are kept, the coordinator's loss beside it.
    manifest["coordinator_lost"] = reason;
  }
  if (manifest.value("status", std::string()) == "failed" && !manifest.contains("finished_at"))
    manifest["finished_at"] = utc_timestamp();
  return manifest;
}

}  // namespace

void RunFolder::record_sudden_end(const std::string& reason) const noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(sudden_end_mutex);
      sudden_end_reason = reason;
    }
    std::string why;
    const nlohmann::json manifest =
        parse_untrusted_json(read_text_file(file("manifest.json"), "manifest.json"), &why);
    if (!manifest.is_object()) return;
    const auto status = manifest.find("status");
    if (status != manifest.end() && status->is_string() && *status != "running" && *status != "failed")
      return;  // completed or stopped before the coordinator went
    write_manifest(manifest);  // with the reason, as every write from now on
  } catch (const std::exception& e) {
    std::fprintf(stderr, "could not record the end in %s: %s\n", file("manifest.json").c_str(), e.what());
  }
}

void RunFolder::write_manifest(const nlohmann::json& given) const {
  const std::string path = file("manifest.json");
  std::lock_guard<std::mutex> lock(sudden_end_mutex);
  const nlohmann::json manifest = sudden_end_reason.empty() ? given : with_sudden_end(given, sudden_end_reason);
  try {
    write_file_atomically(path, manifest.dump(2) + "\n");
  } catch (const RunError& full) {
    // No room for a new file (a full disk). The manifest must not go on
    // claiming what is no longer true ("running"): its outcome, shortened,
    // overwrites the old file in place, which needs no new blocks.
    nlohmann::json outcome = {{"run_id", run_id_},
                              {"status", manifest.value("status", "failed")},
                              {"manifest_shortened", std::string("the full manifest could not be written (") +
                                                         full.what() + ")"}};
    if (manifest.contains("error")) outcome["error"] = manifest["error"];
    std::string text = outcome.dump() + "\n";
    struct stat info {};
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::fstat(fd, &info) != 0 || text.size() > size_t(info.st_size)) {
      if (fd >= 0) ::close(fd);
      throw;
    }
    text.resize(size_t(info.st_size) - 1, ' ');  // JSON allows trailing spaces
    text += "\n";
    const bool ok = ::pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) throw;
    throw RunError(std::string(full.what()) + " (manifest.json holds the outcome, shortened)");
  }
}

EventWriter::EventWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw RunError("cannot open " + path + " for appending: " + std::strerror(errno));
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write(nlohmann::json event) {
  event["time"] = std::chrono::duration<double>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  std::string line = event.dump() + "\n";
  // A line is written whole or not at all: a failed write (a full disk) is
  // cut back to where the line began, and reported naming the file.
  const long before = std::ftell(file_);
  errno = 0;
  bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size();
  int error = errno;
  if (written) {
    written = std::fflush(file_) == 0;
    error = errno;
  }
  if (written) {
    if (mirror_) mirror_->event(event);
    return;
  }
  std::clearerr(file_);
  if (before >= 0 && ::ftruncate(::fileno(file_), before) == 0) std::fseek(file_, before, SEEK_SET);
  throw RunError("cannot write " + path_ + ": " + std::strerror(error ? error : EIO));
}

std::string cache_folder() {
  std::filesystem::path dir;
  if (const char* own = std::getenv("LOCKSTEP_CACHE_DIR"); own && *own) dir = own;
  else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) dir = std::filesystem::path(xdg) / "lockstep";
  else if (const char* home = std::getenv("HOME"); home && *home) dir = std::filesystem::path(home) / ".cache/lockstep";
  else dir = std::filesystem::temp_directory_path() / "lockstep-cache";
  return dir.string();
}

}  // namespace lockstep
