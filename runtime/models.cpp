#include "runtime/models.h"

#include <torch/torch.h>

#include "runtime/errors.h"

namespace lockstep {
namespace {

namespace nn = torch::nn;

// 784-256-128-10 with ReLU.
class Mlp : public Model {
 public:
  Mlp()
      : fc1_(register_module("fc1", nn::Linear(784, 256))),
        fc2_(register_module("fc2", nn::Linear(256, 128))),
        head_(register_module("head", nn::Linear(128, 10))) {}

  at::Tensor forward(at::Tensor x) override {
    x = x.flatten(1);
    x = torch::relu(fc1_->forward(x));
    x = torch::relu(fc2_->forward(x));
    return head_->forward(x);
  }

 private:
  nn::Linear fc1_, fc2_, head_;
};

// Two 3x3 conv + max-pool blocks (32, 64 channels), fc 128, dropout, fc 10.
class Cnn : public Model {
 public:
  explicit Cnn(double dropout)
      : conv1_(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2_(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc_(register_module("fc", nn::Linear(64 * 7 * 7, 128))),
        dropout_(register_module("dropout", nn::Dropout(dropout))),
        head_(register_module("head", nn::Linear(128, 10))) {}

  at::Tensor forward(at::Tensor x) override {
    x = torch::max_pool2d(torch::relu(conv1_->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2_->forward(x)), 2);
    x = torch::relu(fc_->forward(x.flatten(1)));
    return head_->forward(dropout_->forward(x));
  }

 private:
  nn::Conv2d conv1_, conv2_;
  nn::Linear fc_;
  nn::Dropout dropout_;
  nn::Linear head_;
};

// 784 -> 64, then 24 Linear(64, 64) layers, then 64 -> 10: many small
// gradients, so per-tensor overheads dominate.
class DeepNarrowMlp : public Model {
 public:
  DeepNarrowMlp() : input_(register_module("input", nn::Linear(784, 64))) {
    for (int i = 0; i < 24; ++i)
      layers_.push_back(register_module("layer" + std::to_string(i), nn::Linear(64, 64)));
    head_ = register_module("head", nn::Linear(64, 10));
  }

  at::Tensor forward(at::Tensor x) override {
    x = torch::relu(input_->forward(x.flatten(1)));
    for (auto& layer : layers_) x = torch::relu(layer->forward(x));
    return head_->forward(x);
  }

 private:
  nn::Linear input_;
  std::vector<nn::Linear> layers_;
  nn::Linear head_{nullptr};
};

}  // namespace

ModelRegistry ModelRegistry::with_builtins() {
  ModelRegistry registry;
  registry.add("mlp", [](const ModelSection&) { return std::make_shared<Mlp>(); });
  registry.add("cnn", [](const ModelSection& m) { return std::make_shared<Cnn>(m.dropout); });
  registry.add("deep_mlp", [](const ModelSection&) { return std::make_shared<DeepNarrowMlp>(); });
  return registry;
}

void ModelRegistry::add(const std::string& name, ModelFactory factory) {
  factories_[name] = std::move(factory);
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& entry : factories_) out.push_back(entry.first);
  return out;
}

std::shared_ptr<Model> ModelRegistry::build(const ModelSection& model) const {
  auto it = factories_.find(model.name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& name : names()) known += (known.empty() ? "" : ", ") + name;
    throw InputError("model.name = " + model.name + " is not registered (allowed: " + known + ")");
  }
  return it->second(model);
}

}  // namespace lockstep
