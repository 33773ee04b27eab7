#pragma once
// A rank's training figures as TensorBoard scalars: an event file
// (events.out.tfevents.<time>.<host>.<pid>) in its own folder, which
// TensorBoard reads while it grows. Records follow TensorBoard's framing
// (length, masked CRC-32C of the length, the Event, masked CRC-32C of it);
// the first carries the file version. Every record is flushed when written,
// so a running job can be watched; one writer per file. A write that fails
// (a full disk) is logged once and the file given up: figures for people
// never stop a training run.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep {

// CRC-32C (Castagnoli), as TensorBoard's records use.
uint32_t crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates `folder` when needed. Throws RunError naming the file when it cannot start one.
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // One of the rank's JSON events (run_folder.h's EventWriter) as the
  // scalars it holds: step (train/loss, train/lr, train/samples_per_s,
  // time/<phase>_s; under a gradient scaler scaler/scale and
  // scaler/skipped_total), eval (eval/<split>/<metric>), audit_result
  // (audit/agreed, audit/max_abs_diff), scaler_skipped_step (scaler/scale,
  // scaler/skipped_step), skipped_step, resumed (run/resumed_at_step),
  // end (time/<phase>_s). Other events hold no scalars.
  void event(const nlohmann::json& event);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event_bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lockstep
