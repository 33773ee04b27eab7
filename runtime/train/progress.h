#pragma once
// Progress output a person can follow: on a terminal one line redrawn in
// place (at most twice a second); otherwise a plain line every N steps.
#include <chrono>
#include <cstdint>

namespace lockstep {

class ProgressPrinter {
 public:
  ProgressPrinter(int64_t total_steps, bool terminal, int64_t every_steps);
  // Called after every optimizer step (1-based `step`).
  void update(int64_t step, double loss, double lr, double samples_per_s);
  // Ends the in-place line.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  bool terminal_;
  int64_t every_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace lockstep
