#pragma once
// The job's rendezvous store as the coordinator keeps it: keys and byte
// values in memory, served by the Store call (proto/lockstep.proto) so that
// only callers with the token reach it. Thread-safe. Every wait is bounded
// by the caller's limit and ends at close(); a caller that stalls holds no
// lock another needs. Sizes are bounded so a buggy or hostile client with
// the token cannot exhaust the coordinator's memory.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {

struct KeyValueLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 1 << 20;
  size_t max_total_bytes = 256u << 20;  // keys and values together
};

class KeyValueStore {
 public:
  explicit KeyValueStore(KeyValueLimits limits = {}) : limits_(limits) {}

  // Each returns "" on success or an error for the caller (a key or value
  // too long, the store full, a value ADD cannot read as an integer).
  std::string set(const std::string& key, const std::string& value);
  std::string add(const std::string& key, int64_t amount, int64_t* result);
  // Sets `key` to `desired` if it holds `expected` (unset counts as
  // holding ""); `*now` is what it holds afterwards.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired, std::string* now);

  // The value once `key` is set, waiting at most `limit`; nullopt if it
  // was not set in time or the store closed.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds limit);
  // Whether every key is set, waiting at most `limit` (0: look once).
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds limit);
  bool remove(const std::string& key);
  int64_t size() const;

  // Wakes every waiter; later waits return at once.
  void close();

 private:
  // Stores `value` under `key` if the limits allow, wakes waiters; "" or
  // the error. Caller holds mutex_.
  std::string put_locked(const std::string& key, const std::string& value);
  std::string check_sizes(const std::string& key, const std::string& value, size_t replaced) const;
  bool all_set_locked(const std::vector<std::string>& keys) const;

  const KeyValueLimits limits_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;  // guarded by mutex_
  size_t total_bytes_ = 0;                     // guarded by mutex_
  bool closed_ = false;                        // guarded by mutex_
};

}  // namespace lockstep
