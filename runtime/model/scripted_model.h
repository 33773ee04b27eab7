#pragma once
// TorchScript modules saved from Python (torch.jit.script(m).save(path)) as
// lockstep models. On load the module is put in training mode; parameters
// are taken once per tensor (a weight tied between two layers is one
// parameter: one gradient, one all-reduce, one update) and those with
// requires_grad = False are left to themselves (neither reduced nor
// updated). Each of these choices is logged. The forward's result may be a
// tensor, or a tuple or dict from which model.output picks the element.
#include <memory>
#include <string>

#include "runtime/job/config.h"
#include "runtime/model/model.h"

namespace lockstep {

// Loads model.path. Throws InputError naming the file for a file that is
// missing or not a TorchScript module, a module with no trainable
// parameter (a torch.jit.freeze-d one), or a model.output that does not fit.
std::shared_ptr<Model> load_scripted_model(const ModelSection& section);

}  // namespace lockstep
