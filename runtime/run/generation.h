#pragma once
// The end of this process's generation. When the coordinator restarts a job
// after losing a rank, the ranks that are still alive keep their processes:
// the heartbeat thread calls end_generation(), every blocking wait of the
// training thread that can notice (control-group barriers, the step loop)
// throws GenerationEnded, the rank unwinds and joins the next generation.
// One generation at a time per process.
#include <string>

#include "runtime/base/errors.h"

namespace lockstep {

class GenerationEnded : public RunError {
 public:
  explicit GenerationEnded(const std::string& message) : RunError(message) {}
};

void end_generation(const std::string& reason);
bool generation_ended();
// Throws GenerationEnded (naming `where`) once the generation has ended.
void throw_if_generation_ended(const std::string& where);
// Before joining the next generation.
void start_new_generation();

}  // namespace lockstep
