#include "runtime/audit/step_evidence.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "runtime/base/untrusted_json.h"

namespace lockstep {
namespace {

constexpr size_t kMaxEvidenceLine = 1u << 20;
constexpr int64_t kMaxLines = 100'000'000;
constexpr int64_t kMaxMicrobatchesPerLine = 65536;

std::string evidence_hex(uint64_t value) { return fmt::format("{:016x}", value); }

// One line of at most `limit` bytes; false at the end of the stream.
bool read_bounded_line(std::istream& in, std::string& line, size_t limit, const std::string& where) {
  line.clear();
  std::streambuf* buffer = in.rdbuf();
  bool any = false;
  for (int c = buffer->sbumpc(); c != EOF; c = buffer->sbumpc()) {
    any = true;
    if (c == '\n') return true;
    if (line.size() >= limit)
      throw InputError(where + ": a line longer than " + std::to_string(limit) + " bytes: not step evidence");
    line.push_back(char(c));
  }
  return any;
}

int64_t integer_in(const nlohmann::json& line, const char* key, int64_t low, int64_t high, const std::string& where) {
  auto v = line.find(key);
  if (v == line.end() || !v->is_number_integer() || v->get<int64_t>() < low || v->get<int64_t>() > high)
    throw InputError(where + ": '" + key + "' must be an integer from " + std::to_string(low) + " to " +
                     std::to_string(high));
  return v->get<int64_t>();
}

std::string hex_in(const nlohmann::json& object, const char* key, bool required, const std::string& where) {
  auto v = object.find(key);
  if (v == object.end() && !required) return "";
  if (v == object.end() || !v->is_string() || v->get_ref<const std::string&>().size() > 64 ||
      v->get_ref<const std::string&>().find_first_not_of("0123456789abcdef") != std::string::npos)
    throw InputError(where + ": '" + key + "' must be a digest in lowercase hex digits");
  return v->get<std::string>();
}

StepRecord parse_record(const nlohmann::json& line, const std::string& where) {
  StepRecord record;
  record.step = integer_in(line, "step", 1, int64_t(1) << 50, where);
  record.rank = int(integer_in(line, "rank", 0, 65535, where));
  record.world_size = int(integer_in(line, "world_size", 1, 65536, where));
  if (record.rank >= record.world_size) throw InputError(where + ": rank is not below world_size");
  record.generation = integer_in(line, "generation", 0, int64_t(1) << 40, where);
  record.after_checkpoint = integer_in(line, "after_checkpoint", -1, record.step, where);
  if (auto host = line.find("host"); host != line.end()) {
    if (!host->is_string() || host->get_ref<const std::string&>().size() > 300)
      throw InputError(where + ": 'host' must be a string of at most 300 characters");
    record.host = host->get<std::string>();
  }
  record.state.parameters = hex_in(line, "parameters", false, where);
  record.state.buffers = hex_in(line, "buffers", false, where);
  if (line.contains("threads")) record.threads = int(integer_in(line, "threads", 1, 4096, where));
  auto list = line.find("microbatches");
  if (list == line.end() || !list->is_array() || int64_t(list->size()) > kMaxMicrobatchesPerLine)
    throw InputError(where + ": 'microbatches' must be an array of at most " +
                     std::to_string(kMaxMicrobatchesPerLine) + " entries");
  for (const auto& entry : *list) {
    if (!entry.is_object()) throw InputError(where + ": a microbatch entry is not an object");
    const int64_t index = integer_in(entry, "index", 0, int64_t(1) << 40, where);
    record.microbatches[index] = hex_in(entry, "grad", true, where);
    auto loss = entry.find("loss");
    if (loss != entry.end() && loss->is_number()) record.losses[index] = loss->get<double>();
  }
  return record;
}

}  // namespace

std::string step_evidence_file(int64_t generation, int rank) {
  return "step-evidence-g" + std::to_string(generation) + "-rank" + std::to_string(rank) + ".jsonl";
}

std::string MicrobatchDigest::combined() const {
  std::vector<uint64_t> words;
  words.reserve(tensors.size() * 2 + 2);
  for (const auto& t : tensors) words.push_back(t.high), words.push_back(t.low);
  uint64_t bits[2];
  std::memcpy(&bits[0], &loss_sum, 8);
  std::memcpy(&bits[1], &valid, 8);
  words.push_back(bits[0]), words.push_back(bits[1]);
  return evidence_hex(hash_bytes(words.data(), words.size() * sizeof(uint64_t)));
}

MicrobatchDigest digest_microbatch(int64_t step, int64_t index, const std::vector<at::Tensor>& gradients,
                                   double loss_sum, double valid) {
  MicrobatchDigest out;
  out.step = step;
  out.index = index;
  out.loss_sum = loss_sum;
  out.valid = valid;
  out.tensors.reserve(gradients.size());
  for (const auto& g : gradients) out.tensors.push_back(bits_digest(g));
  return out;
}

void EvidenceRecorder::on_microbatch(const MicrobatchDigest& microbatch) {
  pending_.push_back({{"index", microbatch.index}, {"grad", microbatch.combined()}, {"loss", microbatch.loss_sum}});
}

void EvidenceRecorder::on_step_end(int64_t step, const StateDigest& state) {
  nlohmann::json line = {{"event", "step_evidence"},
              {"step", step},
              {"rank", where_.rank},
              {"world_size", where_.world_size},
              {"generation", where_.generation},
              {"host", where_.host},
              {"threads", where_.threads},
              {"after_checkpoint", checkpoint_},
              {"microbatches", pending_}};
  if (!state.parameters.empty()) line["parameters"] = state.parameters;
  if (!state.buffers.empty()) line["buffers"] = state.buffers;
  out_.write(line);
  pending_ = nlohmann::json::array();
}

RunEvidence read_run_evidence(const std::string& run_dir) {
  namespace fs = std::filesystem;
  RunEvidence evidence;
  std::error_code listing;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(run_dir, listing)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-evidence-", 0) == 0 && name.size() > 20 && name.substr(name.size() - 6) == ".jsonl")
      files.push_back(entry.path());
  }
  if (listing) throw InputError(run_dir + ": cannot be listed (" + listing.message() + ")");
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode))
      throw InputError(path.string() + ": not a regular file");
    std::ifstream in(path);
    if (!in) throw InputError(path.string() + ": cannot be read");
    std::string text;
    int64_t number = 0;
    while (read_bounded_line(in, text, kMaxEvidenceLine, path.string() + ":" + std::to_string(number + 1))) {
      ++number;
      if (++evidence.lines > kMaxLines)
        throw InputError(run_dir + ": more than " + std::to_string(kMaxLines) + " lines of step evidence");
      if (text.empty()) continue;
      const std::string where = path.string() + ":" + std::to_string(number);
      std::string why;
      const nlohmann::json line = parse_untrusted_json(text, &why, JsonLimits{kMaxEvidenceLine, 8});
      if (line.is_discarded()) throw InputError(where + ": truncated or corrupt line (" + why + ")");
      if (!line.is_object()) continue;
      const auto event = line.find("event");
      if (event == line.end() || !event->is_string() || event->get_ref<const std::string&>() != "step_evidence") continue;
      StepRecord record = parse_record(line, where);
      record.file = path.string();
      record.line = number;
      evidence.steps[record.step].push_back(std::move(record));
    }
  }
  return evidence;
}

void ReplayCheck::on_microbatch(const MicrobatchDigest& microbatch) {
  if (microbatch.step < first_) return;
  const auto records = evidence_.steps.find(microbatch.step);
  if (records == evidence_.steps.end()) return;
  const std::string computed = microbatch.combined();
  for (const auto& record : records->second) {
    const auto recorded = record.microbatches.find(microbatch.index);
    if (recorded == record.microbatches.end()) continue;
    ++microbatches_checked_;
    if (recorded->second == computed) continue;
    std::string loss;
    if (auto l = record.losses.find(microbatch.index); l != record.losses.end() && l->second != microbatch.loss_sum)
      loss = fmt::format("; its loss sum too: recorded {:.9g}, replayed {:.9g}", l->second, microbatch.loss_sum);
    else
      loss = "; the loss sum agrees: the gradient differs";
    throw ReplayMismatch(
        fmt::format("step {}, microbatch {}: rank {} ({}, generation {} on {} ranks) recorded gradient digest {}, "
                    "the replay computed {}{} ({}:{})",
                    microbatch.step, microbatch.index, record.rank, record.host.empty() ? "host unknown" : record.host,
                    record.generation, record.world_size, recorded->second, computed, loss, record.file, record.line),
        microbatch.step, microbatch.index, record.rank);
  }
}

void ReplayCheck::on_step_end(int64_t step, const StateDigest& state) {
  if (step < first_) return;
  ++steps_checked_;
  const auto records = evidence_.steps.find(step);
  if (records == evidence_.steps.end()) return;
  for (const auto& record : records->second) {
    for (const bool buffers : {false, true}) {
      const std::string& recorded = buffers ? record.state.buffers : record.state.parameters;
      const std::string& computed = buffers ? state.buffers : state.parameters;
      if (recorded.empty() || (buffers && !buffers_)) continue;
      ++states_checked_;
      if (recorded == computed) continue;
      throw ReplayMismatch(fmt::format("step {}: the {} after it differ: rank {} ({}, generation {} on {} ranks) "
                                       "recorded {}, the replay computed {} ({}:{})",
                                       step, buffers ? "buffers" : "parameters", record.rank,
                                       record.host.empty() ? "host unknown" : record.host, record.generation,
                                       record.world_size, recorded, computed.empty() ? "none" : computed,
                                       record.file, record.line),
                           step, -1, record.rank);
    }
  }
}

}  // namespace lockstep
