#include "coordinator/key_value_store.h"

#include <cerrno>
#include <cstdlib>

namespace lockstep {

std::string KeyValueStore::check_sizes(const std::string& key, const std::string& value,
                                       size_t replaced) const {
  if (key.size() > limits_.max_key_bytes)
    return "store key of " + std::to_string(key.size()) + " bytes (at most " +
           std::to_string(limits_.max_key_bytes) + ")";
  if (value.size() > limits_.max_value_bytes)
    return "store value of " + std::to_string(value.size()) + " bytes for key '" + key.substr(0, 200) +
           "' (at most " + std::to_string(limits_.max_value_bytes) + ")";
  if (total_bytes_ - replaced + key.size() + value.size() > limits_.max_total_bytes)
    return "the job's store is full (" + std::to_string(limits_.max_total_bytes >> 20) + " MiB)";
  return "";
}

bool KeyValueStore::all_set_locked(const std::vector<std::string>& keys) const {
  for (const auto& key : keys)
    if (!values_.count(key)) return false;
  return true;
}

std::string KeyValueStore::put_locked(const std::string& key, const std::string& value) {
  auto it = values_.find(key);
  const size_t replaced = it == values_.end() ? 0 : key.size() + it->second.size();
  if (auto error = check_sizes(key, value, replaced); !error.empty()) return error;
  total_bytes_ = total_bytes_ - replaced + key.size() + value.size();
  values_[key] = value;
  changed_.notify_all();
  return "";
}

std::string KeyValueStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  return put_locked(key, value);
}

std::string KeyValueStore::add(const std::string& key, int64_t amount, int64_t* result) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t current = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    const std::string& text = it->second;
    char* end = nullptr;
    errno = 0;
    current = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || errno != 0 || end != text.c_str() + text.size())
      return "store key '" + key.substr(0, 200) + "' does not hold an integer; ADD needs one";
  }
  if ((amount > 0 && current > INT64_MAX - amount) || (amount < 0 && current < INT64_MIN - amount))
    return "ADD would overflow store key '" + key.substr(0, 200) + "'";
  if (auto error = put_locked(key, std::to_string(current + amount)); !error.empty()) return error;
  *result = current + amount;
  return "";
}

std::string KeyValueStore::compare_set(const std::string& key, const std::string& expected,
                                       const std::string& desired, std::string* now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end() && !expected.empty()) {
    *now = expected;  // as c10d's TCPStore answers: nothing was set
    return "";
  }
  const std::string current = it == values_.end() ? "" : it->second;
  if (current != expected) {
    *now = current;
    return "";
  }
  if (auto error = put_locked(key, desired); !error.empty()) return error;
  *now = desired;
  return "";
}

std::optional<std::string> KeyValueStore::get(const std::string& key, std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, limit, [&] { return closed_ || values_.count(key) > 0; });
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

bool KeyValueStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, limit, [&] { return closed_ || all_set_locked(keys); });
  return all_set_locked(keys);
}

bool KeyValueStore::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  total_bytes_ -= key.size() + it->second.size();
  values_.erase(it);
  return true;
}

int64_t KeyValueStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(values_.size());
}

void KeyValueStore::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace lockstep
