#include "runtime/run/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82f63b78u ^ (c >> 1) : c >> 1;  // reflected Castagnoli
    table[i] = c;
  }
  return table;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Protocol-buffer wire format, the few shapes an Event needs.
void varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(char(value | 0x80));
    value >>= 7;
  }
  out.push_back(char(value));
}

void key(std::string& out, int field, int wire_type) { varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }

template <typename T>
void fixed(std::string& out, int field, T value) {
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian, as the wire format is
  out.append(bytes, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& value) {
  key(out, field, 2);
  varint(out, value.size());
  out += value;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1 (double); step = 2 (int64); file_version = 3; summary = 5 }
std::string event_bytes(int64_t step, const std::string& file_version, const std::string& summary) {
  std::string out;
  fixed(out, 1, now_seconds());
  key(out, 2, 0);
  varint(out, uint64_t(step));
  if (!file_version.empty()) bytes_field(out, 3, file_version);
  if (!summary.empty()) bytes_field(out, 5, summary);
  return out;
}

void add_numbers(std::vector<std::pair<std::string, double>>& out, const std::string& prefix, const nlohmann::json& object,
                 const std::string& suffix = "") {
  if (!object.is_object()) return;
  for (const auto& [name, value] : object.items())
    if (value.is_number()) out.emplace_back(prefix + name + suffix, value.get<double>());
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  path_ = folder + "/events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." + host + "." +
          std::to_string(::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw RunError("cannot create the TensorBoard file " + path_ + ": " + std::strerror(errno));
  record(event_bytes(0, "brain.Event:2", ""));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::record(const std::string& data) {
  if (!file_) return;
  std::string framed;
  const uint64_t length = data.size();
  char length_bytes[8];
  std::memcpy(length_bytes, &length, 8);
  framed.append(length_bytes, 8);
  const uint32_t length_crc = masked(crc32c(length_bytes, 8)), data_crc = masked(crc32c(data.data(), data.size()));
  framed.append(reinterpret_cast<const char*>(&length_crc), 4);
  framed += data;
  framed.append(reinterpret_cast<const char*>(&data_crc), 4);
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size() || std::fflush(file_) != 0) {
    spdlog::warn("cannot write the TensorBoard file {} ({}); no more scalars go to it, training goes on", path_,
                 std::strerror(errno ? errno : EIO));
    std::fclose(file_);
    file_ = nullptr;
  }
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return;
  // Summary { value = 1 (repeated) }; Value { tag = 1; simple_value = 2 (float) }
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string one;
    bytes_field(one, 1, tag);
    fixed(one, 2, float(value));
    bytes_field(summary, 1, one);
  }
  record(event_bytes(step, "", summary));
}

void TensorBoardWriter::event(const nlohmann::json& e) {
  const std::string kind = e.value("event", "");
  const int64_t step = e.contains("step") && e["step"].is_number_integer() ? e["step"].get<int64_t>() : 0;
  std::vector<std::pair<std::string, double>> values;
  if (kind == "step") {
    add_numbers(values, "train/", {{"loss", e.value("loss", 0.0)}, {"lr", e.value("lr", 0.0)},
                                   {"samples_per_s", e.value("samples_per_s", 0.0)}});
    if (e.contains("phases")) add_numbers(values, "time/", e["phases"], "_s");
    if (e.contains("scaler"))
      add_numbers(values, "scaler/", {{"scale", e["scaler"].value("scale", 0.0)},
                                      {"skipped_total", e["scaler"].value("skipped", 0.0)}});
    // Running totals: the wall time and what it leaves over are known at the end only.
    values.erase(std::remove_if(values.begin(), values.end(),
                                [](const auto& v) { return v.first == "time/wall_s" || v.first == "time/other_s"; }),
                 values.end());
  } else if (kind == "eval") {
    const std::string split = e.value("split", "test");
    if (e.contains("metrics")) add_numbers(values, "eval/" + split + "/", e["metrics"]);
  } else if (kind == "audit_result") {
    values = {{"audit/agreed", e.value("agreed", true) ? 1.0 : 0.0}, {"audit/max_abs_diff", e.value("max_abs_diff", 0.0)}};
  } else if (kind == "scaler_skipped_step") {
    values = {{"scaler/scale", e.value("scale_after", 0.0)}, {"scaler/skipped_step", 1.0}};
  } else if (kind == "skipped_step") {
    values = {{"train/skipped_step", 1.0}};
  } else if (kind == "resumed") {
    values = {{"run/resumed_at_step", double(step)}};
  } else if (kind == "end") {
    if (e.contains("phases")) add_numbers(values, "time/", e["phases"], "_s");
    const auto& metrics = e.value("metrics", nlohmann::json::object());
    const int64_t steps = metrics.value("steps", int64_t(0));
    scalars(steps, values);
    return;
  }
  scalars(step, values);
}

}  // namespace lockstep
