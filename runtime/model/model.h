#pragma once
// A model as the trainer sees it, whatever built it: a forward from one
// input tensor to one output tensor, the trainable parameters (one entry per
// storage, frozen ones left out), the buffers, train/eval mode, the
// precision policy it can honour, an optional loss of its own, and the
// trained model as a file. Built-in models (runtime/model/models.h) and
// TorchScript modules saved from Python (runtime/model/scripted_model.h)
// implement it; the trainer, checkpoints and audits know nothing else.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/run/decisions.h"

namespace lockstep {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Model {
 public:
  virtual ~Model() = default;

  // The output for a batch of inputs (for a module returning a tuple or a
  // dict, the element model.output picks).
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // Trainable parameters in registration order, one per storage: the ones
  // the reducer all-reduces and the optimizer updates.
  virtual NamedTensors parameters() const = 0;
  // Every buffer (BatchNorm running statistics, counters), by name.
  virtual NamedTensors buffers() const = 0;
  virtual void train(bool on) = 0;
  virtual bool is_training() const = 0;
  // Where its parameters live; inputs and targets are moved there.
  c10::Device device() const;
  // Moves parameters and buffers to `device` in place: the tensors that
  // parameters() and buffers() returned before see the new memory.
  virtual void to(const c10::Device& device) = 0;

  // precision.fp32_modules: these submodules run with autocast off. Throws
  // InputError naming a module the model lacks, or why it cannot be honoured.
  virtual void set_fp32_modules(const std::vector<std::string>& names) = 0;
  // precision.check_overflow: find the first module whose output holds
  // inf/NaN. Throws InputError when the model cannot.
  virtual void set_overflow_check(bool on) = 0;
  // The first module whose output held inf/NaN since the last call ("" = none).
  virtual std::string take_overflow() { return ""; }

  // loss.name = model: the model's own loss, one value per sample.
  virtual bool has_own_loss() const { return false; }
  virtual at::Tensor own_loss(const at::Tensor& output, const at::Tensor& target);

  // The trained model as the bytes of model-final.pt, its tensors on the
  // CPU whatever device it trains on (a file any machine can load).
  virtual std::string saved_bytes() = 0;
  // Choices made while loading and on the first forward (tied weights,
  // frozen parameters, the output element), for the decision log.
  virtual std::vector<Decision> decisions() const { return {}; }
  // "the built-in cnn", "the TorchScript module in net.pt": for messages.
  virtual std::string description() const = 0;
};

// The model's output for `input` in fp32: under autocast to `autocast`
// (at::kBFloat16, or at::kHalf on CUDA) on the input's device, unless it
// is at::kFloat.
at::Tensor forward_output(Model& model, const at::Tensor& input, at::ScalarType autocast);
// The autocast dtype of a resolved precision: fp32 | bf16 | fp16.
at::ScalarType autocast_dtype(const std::string& precision);

// Runs `call` (the model's forward, loss or backward). What it raises
// becomes a ModelFailure whose line is "<where> (precision <precision>)
// failed in <the model>: <the error's own line>" and whose detail is the
// whole message; an InputError or RunError passes unchanged.
void run_model_call(const std::string& where, const std::string& precision, const Model& model,
                    const std::function<void()>& call);

}  // namespace lockstep
