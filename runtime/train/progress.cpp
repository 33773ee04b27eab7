#include "runtime/train/progress.h"

#include <cstdio>

#include <spdlog/spdlog.h>

namespace lockstep {

ProgressPrinter::ProgressPrinter(int64_t total_steps, bool terminal, int64_t every_steps)
    : total_(total_steps), terminal_(terminal), every_(every_steps) {}

void ProgressPrinter::update(int64_t step, double loss, double lr, double samples_per_s) {
  const auto now = Clock::now();
  const bool last = step == total_;
  if (terminal_ ? (!last && now - last_draw_ < std::chrono::milliseconds(500))
                : (step % every_ != 0 && !last))
    return;
  last_draw_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double eta = step > 0 ? elapsed * double(total_ - step) / double(step) : 0.0;
  char text[200];
  std::snprintf(text, sizeof text,
                "step %lld/%lld (%3.0f%%)  loss %.4f  lr %.4g  %.0f samples/s  ETA %dm%02ds",
                static_cast<long long>(step), static_cast<long long>(total_),
                100.0 * double(step) / double(total_), loss, lr, samples_per_s, int(eta) / 60,
                int(eta) % 60);
  if (terminal_) {
    std::printf("\r%s\x1b[K", text);
    std::fflush(stdout);
    drawn_ = true;
  } else {
    spdlog::info("{}", text);
  }
}

void ProgressPrinter::finish() {
  if (drawn_) {
    std::printf("\n");
    std::fflush(stdout);
    drawn_ = false;
  }
}

}  // namespace lockstep
