#include "runtime/run/generation.h"

#include <atomic>
#include <mutex>

namespace lockstep {
namespace {

std::atomic<bool> g_ended{false};
std::mutex g_reason_mutex;
std::string g_reason;  // guarded by g_reason_mutex
std::function<void()> g_on_end;  // guarded by g_reason_mutex

}  // namespace

void end_generation(const std::string& reason) {
  std::function<void()> action;
  {
    std::lock_guard<std::mutex> lock(g_reason_mutex);
    g_reason = reason;
    action = std::move(g_on_end);
    g_on_end = nullptr;
  }
  g_ended = true;
  if (action) action();
}

void when_generation_ends(std::function<void()> action) {
  std::lock_guard<std::mutex> lock(g_reason_mutex);
  g_on_end = std::move(action);
}

bool generation_ended() { return g_ended; }

void throw_if_generation_ended(const std::string& where) {
  if (!g_ended) return;
  std::lock_guard<std::mutex> lock(g_reason_mutex);
  throw GenerationEnded(where + ": the coordinator ended this generation (" + g_reason + ")");
}

void start_new_generation() {
  {
    std::lock_guard<std::mutex> lock(g_reason_mutex);
    g_on_end = nullptr;
  }
  g_ended = false;
}

}  // namespace lockstep
