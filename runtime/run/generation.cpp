#include "runtime/run/generation.h"

#include <atomic>
#include <mutex>

namespace lockstep {
namespace {

std::atomic<bool> g_ended{false};
std::mutex g_reason_mutex;
std::string g_reason;  // guarded by g_reason_mutex

}  // namespace

void end_generation(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(g_reason_mutex);
    g_reason = reason;
  }
  g_ended = true;
}

bool generation_ended() { return g_ended; }

void throw_if_generation_ended(const std::string& where) {
  if (!g_ended) return;
  std::lock_guard<std::mutex> lock(g_reason_mutex);
  throw GenerationEnded(where + ": the coordinator ended this generation (" + g_reason + ")");
}

void start_new_generation() { g_ended = false; }

}  // namespace lockstep
