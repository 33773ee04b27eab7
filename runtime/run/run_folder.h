#pragma once
// The run folder runs/<run-id>/: manifest.json (rewritten whole, atomically,
// at start and end) and one events-rank<N>.jsonl per rank (appended, one
// JSON object per line, flushed per line).
#include <cstdio>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

// "<job-name>-YYYYmmdd-HHMMSS-<4 hex>", unique enough for one machine.
std::string new_run_id(const std::string& job_name);

// `bytes` random bytes from the system's source, as hex.
std::string random_hex(int bytes);

// Now, as ISO 8601 in UTC: "2026-12-02T14:07:08Z".
std::string utc_timestamp(std::time_t when = std::time(nullptr));

// Writes `contents` to `path` via a temporary file, fsync and rename, so a
// reader sees the old file or the new one, never half of one.
void write_file_atomically(const std::string& path, const std::string& contents);

// This user's cache folder for lockstep (not created): $LOCKSTEP_CACHE_DIR,
// else $XDG_CACHE_HOME/lockstep, else ~/.cache/lockstep.
std::string cache_folder();

// The whole contents of `path`, a regular file of at most `max_bytes`.
// Throws InputError naming `what` (a flag or key) and the path when the
// file cannot be read, is not a regular file (a FIFO, /dev/zero) or is
// larger.
std::string read_text_file(const std::string& path, const std::string& what,
                           size_t max_bytes = 16u << 20);

class RunFolder {
 public:
  // Names runs/<run-id> under `root`; create() makes it (rank 0 only).
  RunFolder(const std::string& root, const std::string& run_id);
  void create() const;
  const std::string& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write_manifest(const nlohmann::json& manifest) const;
  // For a rank that must end at once (its coordinator is gone): a manifest
  // that still says "running" is rewritten as "failed" with `reason`, so
  // that nothing goes on showing a dead job as running; one that says
  // "failed" already keeps its error and gets `coordinator_lost` = reason.
  // Never throws: the process is on its way out and says so itself.
  void record_sudden_end(const std::string& reason) const noexcept;

 private:
  std::string path_;
  std::string run_id_;
};

// The one writer of a run folder: an advisory lock (flock) on
// <folder>/.lock, which names its holder (host and pid), held until this
// object goes (or its process ends: a killed writer leaves no stale lock).
class RunFolderLock {
 public:
  // Creates the folder if needed and takes the lock. Throws InputError
  // naming the holder when another process has it.
  explicit RunFolderLock(const std::string& folder);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  int fd_ = -1;
};

class TensorBoardWriter;

// Appends JSON lines to a file. Not thread-safe.
class EventWriter {
 public:
  explicit EventWriter(const std::string& path);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // Adds "time" (seconds since the epoch) and writes one line, whole or
  // not at all. Throws RunError naming the file when it cannot (a full disk).
  void write(nlohmann::json event);
  // Every event written from now on also goes to `scalars` (which outlives this writer's use).
  void mirror_to(TensorBoardWriter* scalars) { mirror_ = scalars; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  TensorBoardWriter* mirror_ = nullptr;
};

}  // namespace lockstep
