#include "runtime/train/phase_timer.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace lockstep {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kStartup: return "startup";
    case Phase::kData: return "data";
    case Phase::kForwardBackward: return "forward_backward";
    case Phase::kCommWait: return "comm_wait";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kAudit: return "audit";
    case Phase::kEval: return "eval";
    case Phase::kCheckpoint: return "checkpoint";
  }
  return "?";
}

double PhaseTimer::train_seconds() const {
  return seconds(Phase::kData) + seconds(Phase::kForwardBackward) + seconds(Phase::kCommWait) +
         seconds(Phase::kOptimizer);
}

nlohmann::json PhaseTimer::to_json(double wall_seconds) const {
  nlohmann::json out;
  double covered = 0;
  for (int p = 0; p < kPhaseCount; ++p) {
    out[phase_name(Phase(p))] = seconds_[p];
    covered += seconds_[p];
  }
  out["other"] = std::max(0.0, wall_seconds - covered);
  out["wall"] = wall_seconds;
  return out;
}

std::string PhaseTimer::table(double wall_seconds) const {
  std::string out = "phase              seconds   share\n";
  char line[96];
  double covered = 0;
  auto row = [&](const char* name, double s) {
    std::snprintf(line, sizeof line, "%-17s %9.2f  %5.1f%%\n", name, s,
                  wall_seconds > 0 ? 100.0 * s / wall_seconds : 0.0);
    out += line;
  };
  for (int p = 0; p < kPhaseCount; ++p) {
    row(phase_name(Phase(p)), seconds_[p]);
    covered += seconds_[p];
  }
  row("other", std::max(0.0, wall_seconds - covered));
  row("wall", wall_seconds);
  return out;
}

}  // namespace lockstep
