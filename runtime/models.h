#pragma once
// Models and the registry they are built from. A model maps a batch of
// images [B, 1, 28, 28] to logits [B, 10]. Users add their own models from
// C++ by registering a factory under a new name before starting a worker.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "runtime/config.h"

namespace lockstep {

class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(at::Tensor images) = 0;
};

using ModelFactory = std::function<std::shared_ptr<Model>(const ModelSection&)>;

// Name -> factory. Not thread-safe; fill it before training starts.
class ModelRegistry {
 public:
  // A registry holding the built-in models: mlp, cnn, deep_mlp.
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
