#include "runtime/startup/model_checks.h"

#include <functional>
#include <string>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "runtime/loss/objective.h"

namespace lockstep {

namespace {

// The settings that name parts of the model, checked against `model`.
void check_model_settings(const JobConfig& config, Model& model) {
  model.set_fp32_modules(split_names(config.precision.fp32_modules));
  model.set_overflow_check(config.precision.check_overflow);
  make_objective(config.loss, model);  // loss.name = model needs the model's loss method
  parse_augment(config.data.augment);   // an unknown augmentation is bad input
  for (const auto& fault : parse_injected_faults(config.fault.inject)) {
    std::string names;
    bool found = false;
    for (const auto& [name, tensor] : model.parameters()) {
      found |= name == fault.tensor;
      names += (names.empty() ? "" : ", ") + name;
    }
    if (!found)
      throw InputError("fault.inject names tensor '" + fault.tensor + "', which model " +
                       config.model.name + " does not have (it has: " + names + ")");
  }
}

// Class targets of every split against the model's outputs: one max and
// one min over each split's targets, so a label the first batch does not
// hold (class 200 in the last row, an eleventh class folder) is refused now
// rather than failing a rank mid-run.
void check_class_targets(const JobConfig& config, const TrainTestData& data, const at::Tensor& output) {
  if (config.loss.name != "cross_entropy" || output.dim() != 2) return;
  const int64_t classes = output.size(1);
  const std::vector<std::pair<std::string, const Dataset*>> splits = {
      {"data.train", &data.train}, {"data.test", &data.test}, {"data.validation", &data.validation}};
  for (const auto& [key, set] : splits) {
    if (!set->targets.defined() || set->targets.numel() == 0 || at::isFloatingType(set->targets.scalar_type()))
      continue;
    const at::Tensor targets = set->targets.to(at::kLong).flatten();
    const int64_t low = targets.min().item<int64_t>(), high = targets.max().item<int64_t>();
    const std::string source = key + " (" + config.data.name + ")";
    if (low < -1)
      throw InputError(source + " holds class target " + std::to_string(low) + " (row " +
                       std::to_string(targets.argmin().item<int64_t>()) + "); class targets are 0 to " +
                       std::to_string(classes - 1) + ", and -1 marks a missing target");
    if (high >= classes) {
      std::string hint = "; give the model " + std::to_string(high + 1) + " outputs, or fix the targets";
      if (!data.classes.empty())
        hint = ": the data has " + std::to_string(data.classes.size()) + " classes (" + data.classes.front() +
               " ... " + data.classes.back() + ") for the model's " + std::to_string(classes) + " outputs" + hint;
      throw InputError(source + " holds class target " + std::to_string(high) + " (row " +
                       std::to_string(targets.argmax().item<int64_t>()) + ") but " + config.model.name +
                       " gives " + std::to_string(classes) + " outputs (classes 0 to " +
                       std::to_string(classes - 1) + ")" + hint);
    }
  }
}

}  // namespace

void check_injected_faults(const JobConfig& config, const ModelRegistry& registry) {
  check_model_settings(config, *registry.build(config.model));  // an unknown name: InputError
}

namespace {

// Every rank holding the same NaN passes the agreement check: the values
// themselves are checked. A non-finite parameter or buffer is bad input; a
// weight matrix that is entirely zero (an uninitialised tensor in a
// scripted model) trains as a dead layer, which is said.
void check_parameters_are_sane(const Model& model) {
  for (const auto& kind : {std::string("parameter"), std::string("buffer")}) {
    for (const auto& [name, tensor] : kind == "parameter" ? model.parameters() : model.buffers()) {
      if (!tensor.defined() || tensor.numel() == 0 || !at::isFloatingType(tensor.scalar_type())) continue;
      const at::Tensor values = tensor.detach();
      const int64_t bad = (~at::isfinite(values)).sum().item<int64_t>();
      if (bad > 0)
        throw InputError(model.description() + ": " + kind + " '" + name + "' " + c10::str(values.sizes()) +
                         " holds " + std::to_string(bad) + " non-finite value(s) (NaN or Inf) before training; "
                         "initialise it in the model (e.g. nn.init) and export it again");
      if (kind == "parameter" && values.dim() >= 2 && !values.ne(0).any().item<bool>())
        spdlog::warn("{}: weight '{}' {} is entirely zero before training: every unit of that layer starts "
                     "alike and stays alike; initialise it (e.g. nn.init.kaiming_uniform_) unless that is meant",
                     model.description(), name, c10::str(values.sizes()));
    }
  }
}

}  // namespace

namespace {

// A LibTorch or TorchScript message without its C++ trace.
std::string without_trace(const std::string& message) {
  return message.substr(0, message.find("\nException raised from"));
}

// What failed on the microbatch, or "" when the phase ran.
std::string try_phase(const std::function<void()>& phase) {
  try {
    phase();
    return "";
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    return message.empty() ? std::string("(no message)") : message.substr(0, 20000);
  }
}

}  // namespace

std::vector<Decision> check_model_on_data(const JobConfig& config, const ModelRegistry& registry,
                                          const TrainTestData& data, const std::string& precision,
                                          std::string* eval_precision) {
  auto model = registry.build(config.model);
  check_model_settings(config, *model);
  check_parameters_are_sane(*model);
  auto objective = make_objective(config.loss, *model);
  const int64_t rows = std::min<int64_t>(config.data.batch_size, data.train.size());
  const at::Tensor input = data.train.input_rows(torch::arange(rows, torch::kLong));
  const at::Tensor target = data.train.targets.narrow(0, 0, rows);
  Augmenter(parse_augment(config.data.augment), 0).apply(input, 0);  // images only
  const bool bf16 = precision == "bf16";
  auto autocast_of = [](bool low) { return low ? at::kBFloat16 : at::kFloat; };
  const std::string shape_words = " (" + config.data.name + ", data.batch_size " +
                                  std::to_string(config.data.batch_size) + ")";

  // 1. The shape and the loss, in eval mode without gradients and in fp32:
  // what the model rejects whatever the precision.
  at::Tensor output;
  {
    torch::NoGradGuard no_grad;
    model->train(false);  // BatchNorm's running statistics stay as loaded
    if (const std::string failed = try_phase([&] { output = forward_output(*model, input, at::kFloat); });
        !failed.empty())
      throw InputError(model->description() + " rejects the data's input of shape " + c10::str(input.sizes()) +
                       shape_words + ": " + without_trace(failed));
    if (const std::string failed = try_phase([&] { objective->loss(output, target); }); !failed.empty())
      throw InputError("loss.name = " + config.loss.name + " fails on " + model->description() + "'s output " +
                       c10::str(output.sizes()) + " and the targets " + c10::str(target.sizes()) + ": " +
                       without_trace(failed));
  }
  check_class_targets(config, data, output);
  if (precision != "bf16" && precision != "fp32") return model->decisions();  // fp16: CUDA, checked there

  // 2. One training step's forward and backward, then one evaluation
  // forward, each at the run's precision: what fails there would otherwise
  // fail after training began (PyTorch's fused Transformer evaluation path
  // under CPU bf16 autocast, a module that cannot run in bf16).
  auto train_step = [&](bool low) {
    model->train(true);
    at::Tensor out = forward_output(*model, input, autocast_of(low));
    objective->loss(out, target).sum.backward();
    for (auto& [name, parameter] : model->parameters())
      if (parameter.grad().defined()) parameter.mutable_grad() = at::Tensor();
  };
  auto evaluation = [&](bool low) {
    torch::NoGradGuard no_grad;
    model->train(false);
    objective->metric_sums(forward_output(*model, input, autocast_of(low)), target);
  };
  const std::string fixes =
      bf16 ? "; set precision = fp32, or keep the failing submodules in fp32 with precision.fp32_modules = NAME,..."
           : "";
  if (const std::string failed = try_phase([&] { train_step(bf16); }); !failed.empty())
    throw InputError("the dry run of one training step (forward and backward, precision " + precision + ") of " +
                     model->description() + " on a microbatch of shape " + c10::str(input.sizes()) + shape_words +
                     " fails: " + error_line(failed) + fixes);
  // The built-in models' model-final.pt is TorchScript source compiled at
  // the end: compiled here once, so that it cannot fail after training.
  if (native_module(model))
    if (const std::string failed = try_phase([&] { model->saved_bytes(); }); !failed.empty())
      throw RunError(model->description() + " cannot be written as TorchScript (model-final.pt): " +
                     error_line(failed) + "; this is a bug of lockstep's, please report it");
  if (const std::string failed = try_phase([&] { evaluation(bf16); }); !failed.empty()) {
    if (!bf16 || !try_phase([&] { evaluation(false); }).empty() || !eval_precision)
      throw InputError("the dry run of one evaluation forward (precision " + precision + ") of " +
                       model->description() + " on a microbatch of shape " + c10::str(input.sizes()) + shape_words +
                       " fails: " + error_line(failed) + fixes);
    *eval_precision = "fp32";
    std::vector<Decision> decisions = model->decisions();
    decisions.push_back({"eval_precision", "fp32",
                         "the dry run's evaluation forward fails under bf16 autocast (" + error_line(failed) +
                             ") and runs in fp32; training stays in bf16 (PyTorch's fused evaluation path of "
                             "Transformer layers, for one, ignores CPU autocast)"});
    return decisions;
  }
  return model->decisions();
}

}  // namespace lockstep
