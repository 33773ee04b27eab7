#pragma once
// Wall time by phase, on one rank. Phases do not nest; what no phase
// covers shows up as "other" against the whole-run wall time.
#include <array>
#include <chrono>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace lockstep {

enum class Phase {
  kStartup, kData, kForwardBackward, kCommWait, kOptimizer, kAudit, kEval, kCheckpoint
};
constexpr int kPhaseCount = 8;
const char* phase_name(Phase phase);

class PhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;

  // Adds the time from construction to destruction to `phase`.
  class Scope {
   public:
    Scope(PhaseTimer& timer, Phase phase) : timer_(timer), phase_(phase), start_(Clock::now()) {}
    ~Scope() { timer_.add(phase_, std::chrono::duration<double>(Clock::now() - start_).count()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseTimer& timer_;
    Phase phase_;
    Clock::time_point start_;
  };

  Scope measure(Phase phase) { return Scope(*this, phase); }
  void add(Phase phase, double seconds) { seconds_[int(phase)] += seconds; }
  double seconds(Phase phase) const { return seconds_[int(phase)]; }
  // Training proper: data + forward/backward + communication wait + optimizer.
  double train_seconds() const;

  nlohmann::json to_json(double wall_seconds) const;
  // A table with seconds and share of `wall_seconds` per phase, for people.
  std::string table(double wall_seconds) const;

 private:
  std::array<double, kPhaseCount> seconds_{};
};

}  // namespace lockstep
