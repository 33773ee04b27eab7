#pragma once
// The start-up checks of a job's model against its settings and its data,
// run by the launcher before it starts anything and by every worker before
// it joins a process group: what they find is bad input (InputError, exit
// 2), never a failure after training began.
#include <string>
#include <vector>

#include "runtime/job/config.h"
#include "runtime/model/models.h"
#include "runtime/run/decisions.h"

namespace lockstep {

// fault.inject must name tensors the model has, precision.fp32_modules its
// modules. Throws InputError (an unknown model.name too).
void check_injected_faults(const JobConfig& config, const ModelRegistry& registry);

struct TrainTestData;
// Before any process group, on one microbatch of the first training batch:
// builds the model, applies the precision policy, checks its parameters
// are finite and its class targets fit, runs one forward and the loss in
// eval mode without gradients in fp32 (a model that rejects the data's
// shape, a model.output that does not exist or a loss that does not fit is
// an InputError quoting the model's message and the input shape tried),
// then one training step's forward and backward and one evaluation forward
// at `precision` (fp32 | bf16). A training step that fails there is an
// InputError naming the phase, the precision and the fixes; an evaluation
// that fails only in bf16 sets `*eval_precision` to "fp32" and adds that
// decision (without `eval_precision`, it is an InputError too).
// Returns the model's decisions (tied and frozen parameters, the output picked).
std::vector<Decision> check_model_on_data(const JobConfig& config, const ModelRegistry& registry,
                                          const TrainTestData& data, const std::string& precision = "fp32",
                                          std::string* eval_precision = nullptr);

}  // namespace lockstep
