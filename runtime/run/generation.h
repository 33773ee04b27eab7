#pragma once
// The end of this process's generation. When the coordinator restarts a job
// after losing a rank, the ranks that are still alive keep their processes:
// the heartbeat thread calls end_generation(), every blocking wait of the
// training thread that can notice (control-group barriers, the step loop)
// throws GenerationEnded, the rank unwinds and joins the next generation.
// One generation at a time per process.
#include <functional>
#include <string>

#include "runtime/base/errors.h"

namespace lockstep {

class GenerationEnded : public RunError {
 public:
  explicit GenerationEnded(const std::string& message) : RunError(message) {}
};

// Ends the generation; runs the action given to when_generation_ends, once.
void end_generation(const std::string& reason);
// What ending this generation must also do, on the thread that ends it:
// unblock the waits that cannot poll (a collective on a connection that a
// cut link left open). Replaced by the next call; cleared by start_new_generation.
void when_generation_ends(std::function<void()> action);
bool generation_ended();
// Throws GenerationEnded (naming `where`) once the generation has ended.
void throw_if_generation_ended(const std::string& where);
// Before joining the next generation.
void start_new_generation();

}  // namespace lockstep
