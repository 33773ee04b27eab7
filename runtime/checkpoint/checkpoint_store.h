#pragma once
// The checkpoints of a run, RUN_DIR/checkpoints/step-<N>/: any number of
// files written atomically (each a temp file, fsync, rename, fsync of the
// folder), then index.json, written last, with every file's size and xxh3-64
// checksum. A checkpoint counts as complete only when its index exists and
// every file it lists is there with that size and checksum, so a process
// killed while writing never leaves one that loads as complete. Older
// checkpoints are deleted only after a newer one is complete.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/config.h"

namespace lockstep {

struct FoundCheckpoint {
  int64_t step = 0;
  std::string folder;
  nlohmann::json meta;  // what seal() was given
};

// "" when a run with `config` may resume from a checkpoint with `meta`;
// else which setting it must keep, with both values (model, seed, global
// batch, microbatch, optimizer). The world size may differ: it divides
// the same work.
std::string resume_conflict(const nlohmann::json& meta, const JobConfig& config);

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string folder);  // created on the first write
  const std::string& folder() const { return folder_; }
  std::string step_folder(int64_t step) const;

  // Writes file `name` of checkpoint `step`, atomically.
  void write_file(int64_t step, const std::string& name, const std::string& bytes) const;
  // Makes checkpoint `step` complete: checksums every file in its folder
  // into index.json (with `meta`), then deletes all but the newest `keep`
  // complete checkpoints (and anything older that never completed).
  void seal(int64_t step, const nlohmann::json& meta, int keep) const;

  // The newest complete checkpoint whose files all verify. Each newer one
  // that does not verify is added to `rejected`, naming the file and why.
  // With `at_most`: the newest of those at or before that step.
  std::optional<FoundCheckpoint> newest_valid(std::vector<std::string>* rejected,
                                              int64_t at_most = INT64_MAX) const;
  // The contents of a file of a found checkpoint, checked (size, checksum)
  // against its index; throws RunError naming the file otherwise.
  std::string read_file(const FoundCheckpoint& found, const std::string& name) const;
  // Steps that have a folder (complete or not), oldest first.
  std::vector<int64_t> steps() const;

 private:
  // Empty if checkpoint `step` verifies, else the file and the reason.
  std::string verify(int64_t step, nlohmann::json* index) const;
  std::string folder_;
};

// The xxh3-64 checksum of `bytes`, as 16 hex digits.
std::string checksum_hex(const std::string& bytes);

}  // namespace lockstep
