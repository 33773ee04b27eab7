#include "runtime/checkpoint/checkpoint_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <xxhash.h>

#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"

namespace lockstep {

std::string resume_conflict(const nlohmann::json& meta, const JobConfig& config) {
  auto differs = [&](const std::string& key, const nlohmann::json& now, const char* field) -> std::string {
    if (!meta.is_object() || !meta.contains(field) || meta[field] == now) return "";
    return key + " was " + meta[field].dump() + " in the checkpointed run and is " + now.dump() +
           " now; a resumed run must keep it (set it back, or start a new run)";
  };
  // The world size may change: it only divides the global batch (a
  // checkpoint from before data.global_batch existed names none: then its
  // per-rank batch on its world size is the global batch).
  if (meta.is_object() && !meta.contains("global_batch") && meta.contains("world_size") &&
      meta.contains("batch_size")) {
    const int64_t was = meta.value("batch_size", int64_t(0)) * meta.value("accum_steps", int64_t(1)) *
                        meta.value("world_size", int64_t(1));
    if (was != config.data.global_batch)
      return "the global batch was " + std::to_string(was) + " (data.batch_size x train.accum_steps x " +
             "world size) in the checkpointed run and is " + std::to_string(config.data.global_batch) +
             " now; a resumed run must keep it (set data.global_batch = " + std::to_string(was) + ")";
  }
  for (const std::string& conflict :
       {differs("model.name", config.model.name, "model"), differs("job.seed", config.job.seed, "seed"),
        differs("data.global_batch", config.data.global_batch, "global_batch"),
        differs("data.microbatch", config.data.microbatch, "microbatch"),
        differs("optim.name", config.optim.name, "optimizer")})
    if (!conflict.empty()) return conflict;
  return "";
}
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "index.json";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunError("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Empty if the file at `path` has the size and checksum `expected` (an
// index entry) says, else the path and what differs; `bytes` gets the contents.
std::string check_file(const std::string& path, const nlohmann::json& expected, std::string* bytes) {
  if (!fs::exists(path)) return path + ": missing";
  *bytes = read_bytes(path);
  if (bytes->size() != expected["bytes"].get<size_t>())
    return path + ": " + std::to_string(bytes->size()) + " bytes, the index says " +
           std::to_string(expected["bytes"].get<size_t>()) + " (truncated?)";
  const std::string checksum = checksum_hex(*bytes);
  if (checksum != expected["xxh3"].get<std::string>())
    return path + ": checksum " + checksum + ", the index says " +
           expected["xxh3"].get<std::string>() + " (the file was changed or corrupted)";
  return "";
}

}  // namespace

std::string checksum_hex(const std::string& bytes) {
  return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

CheckpointStore::CheckpointStore(std::string folder) : folder_(std::move(folder)) {}

std::string CheckpointStore::step_folder(int64_t step) const {
  return folder_ + "/" + fmt::format("step-{:09d}", step);
}

void CheckpointStore::write_file(int64_t step, const std::string& name,
                                 const std::string& bytes) const {
  fs::create_directories(step_folder(step));
  fs::remove(step_folder(step) + "/" + kIndex);  // rewriting a step: incomplete until sealed again
  write_file_atomically(step_folder(step) + "/" + name, bytes);
}

void CheckpointStore::seal(int64_t step, const nlohmann::json& meta, int keep) const {
  const std::string folder = step_folder(step);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name == kIndex || name.find(".tmp.") != std::string::npos) continue;
    const std::string bytes = read_bytes(entry.path().string());
    files[name] = {{"bytes", bytes.size()}, {"xxh3", checksum_hex(bytes)}};
  }
  write_file_atomically(folder + "/" + kIndex,
                        nlohmann::json{{"step", step}, {"files", files}, {"meta", meta}}.dump(2));
  // Only now, with a newer complete checkpoint on disk, may older ones go.
  std::vector<int64_t> complete;
  for (int64_t s : steps())
    if (fs::exists(step_folder(s) + "/" + kIndex)) complete.push_back(s);
  const size_t kept = size_t(std::max(1, keep));
  const int64_t oldest_kept = complete[complete.size() > kept ? complete.size() - kept : 0];
  for (int64_t s : steps())
    if (s < oldest_kept) fs::remove_all(step_folder(s));
}

std::vector<int64_t> CheckpointStore::steps() const {
  std::vector<int64_t> out;
  if (!fs::is_directory(folder_)) return out;
  for (const auto& entry : fs::directory_iterator(folder_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !entry.is_directory()) continue;
    try {
      out.push_back(std::stoll(name.substr(5)));
    } catch (const std::exception&) {
      continue;  // not one of ours
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string CheckpointStore::verify(int64_t step, nlohmann::json* index) const {
  const std::string folder = step_folder(step);
  const std::string index_path = folder + "/" + kIndex;
  if (!fs::exists(index_path)) return index_path + ": missing (the checkpoint was never completed)";
  try {
    std::string why;
    *index = parse_untrusted_json(read_bytes(index_path), &why);
    if (index->is_discarded() || !index->is_object() || !index->contains("files") || !(*index)["files"].is_object())
      return index_path + ": not a checkpoint index (" + (why.empty() ? "no files object" : why) + ")";
    const nlohmann::json& files = (*index)["files"];
    // Every file the loader reads is listed (an index that lost an entry
    // would pass the loop below and fail at the load), and so is every file
    // in the folder.
    // (A training checkpoint's meta names its ranks; other users of the
    // store list what they like.)
    std::vector<std::string> required;
    const nlohmann::json meta = index->value("meta", nlohmann::json::object());
    if (meta.is_object() && meta.contains("ranks") && meta["ranks"].is_number_integer()) {
      required = {"model.pt", "optimizer.bin"};
      for (int64_t r = 0; r < meta["ranks"].get<int64_t>() && r < 65536; ++r)
        required.push_back("rng-rank" + std::to_string(r) + ".bin");
    }
    for (const auto& name : required)
      if (!files.contains(name))
        return index_path + ": lists no " + name + ", which resuming reads (a damaged index)";
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      if (name != kIndex && name.find(".tmp.") == std::string::npos && !files.contains(name))
        return folder + "/" + name + ": not in the index (a damaged index, or a file that does not belong)";
    }
    for (const auto& [name, expected] : files.items()) {
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        return index_path + ": lists '" + name + "', which is not a file of this folder";
      std::string bytes;
      const std::string problem = check_file(folder + "/" + name, expected, &bytes);
      if (!problem.empty()) return problem;
    }
  } catch (const nlohmann::json::exception& e) {
    return index_path + ": not a valid index (" + e.what() + ")";
  }
  return "";
}

std::optional<FoundCheckpoint> CheckpointStore::newest_valid(std::vector<std::string>* rejected,
                                                             int64_t at_most) const {
  std::vector<int64_t> all = steps();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (*it > at_most) continue;
    nlohmann::json index;
    const std::string problem = verify(*it, &index);
    if (problem.empty()) return FoundCheckpoint{*it, step_folder(*it), index["meta"]};
    if (rejected) rejected->push_back("checkpoint at step " + std::to_string(*it) + ": " + problem);
  }
  return std::nullopt;
}

std::string CheckpointStore::read_file(const FoundCheckpoint& found, const std::string& name) const {
  // Only this file, against the index: newest_valid() checked the rest.
  const std::string where = "checkpoint at step " + std::to_string(found.step);
  nlohmann::json index;
  try {
    std::string why;
    index = parse_untrusted_json(read_bytes(found.folder + "/" + kIndex), &why);
    if (index.is_discarded() || !index.is_object() || !index["files"].is_object())
      throw RunError(where + ": not a valid index (" + (why.empty() ? "no files object" : why) + ")");
  } catch (const nlohmann::json::exception& e) {
    throw RunError(where + ": not a valid index (" + std::string(e.what()) + ")");
  }
  if (!index["files"].contains(name)) throw RunError(where + " has no file " + name);
  std::string bytes;
  const std::string problem = check_file(found.folder + "/" + name, index["files"][name], &bytes);
  if (!problem.empty()) throw RunError(where + ": " + problem);
  return bytes;
}

}  // namespace lockstep
