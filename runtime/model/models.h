#pragma once
// Built-in models and the registry models are built from. The built-ins
// (mlp, cnn, deep_mlp) map images [B, 1, 28, 28] to logits [B, 10];
// model.name = "torchscript" loads any module saved from Python instead
// (runtime/model/scripted_model.h). Users add models from C++ by
// registering a factory under a new name before starting a worker.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "runtime/job/config.h"
#include "runtime/model/model.h"

namespace lockstep {

// A model written in C++ under a precision policy: forward() calls each
// child module through run(), which applies precision.fp32_modules (that
// child runs with autocast off, its input cast to fp32 before it runs) and,
// when asked, the overflow finder (the first child whose output holds inf
// or NaN).
class NativeModule : public torch::nn::Module {
 public:
  virtual at::Tensor forward(at::Tensor input) = 0;
  // The same forward as TorchScript source (`def forward(self, x): ...`)
  // over the children's parameters (self.fc1.weight, ...), so that
  // model-final.pt is a module Python can load and call. "" (a model
  // registered from C++ without one): model-final.pt holds the parameters
  // only, which is said when it is written.
  virtual std::string torchscript_forward() const { return ""; }

  // Children listed here run in fp32 under autocast. Throws InputError
  // naming an unknown child and the ones there are.
  void set_fp32_modules(const std::vector<std::string>& names);
  void set_overflow_check(bool on) { check_overflow_ = on; }
  // The first child whose output held inf/NaN since clear_overflow() ("" = none).
  const std::string& first_overflow() const { return first_overflow_; }
  void clear_overflow() { first_overflow_.clear(); }

 protected:
  // Runs child `name` as `call(input)` under the policy.
  at::Tensor run(const std::string& name, const std::function<at::Tensor(const at::Tensor&)>& call,
                 const at::Tensor& input);

 private:
  std::vector<std::string> fp32_modules_;
  bool check_overflow_ = false;
  std::string first_overflow_;
};

// `module` behind the Model interface; model-final.pt is a TorchScript
// module with the same parameters under the same names and the same forward
// (torch.jit.load in Python scores it; torch::load into the C++ module reads
// it too). `name` is for messages.
std::shared_ptr<Model> wrap_native(std::shared_ptr<NativeModule> module, const std::string& name);
// The module behind a wrapped native model (nullptr for any other model).
std::shared_ptr<NativeModule> native_module(const std::shared_ptr<Model>& model);

using ModelFactory = std::function<std::shared_ptr<Model>(const ModelSection&)>;

// Name -> factory. Not thread-safe; fill it before training starts.
class ModelRegistry {
 public:
  // A registry holding the built-in models (mlp, cnn, deep_mlp) and
  // torchscript (model.path).
  static ModelRegistry with_builtins();

  // Adds or replaces `name`.
  void add(const std::string& name, ModelFactory factory);
  bool contains(const std::string& name) const { return factories_.count(name) > 0; }
  std::vector<std::string> names() const;

  // Builds model.name. Throws InputError listing the registered names.
  std::shared_ptr<Model> build(const ModelSection& model) const;

 private:
  std::map<std::string, ModelFactory> factories_;
};

}  // namespace lockstep
