#include "runtime/models.h"

#include <ATen/autocast_mode.h>
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
    x = torch::relu(run("fc1", [&](const at::Tensor& t) { return fc1_->forward(t); }, x));
    x = torch::relu(run("fc2", [&](const at::Tensor& t) { return fc2_->forward(t); }, x));
    return run("head", [&](const at::Tensor& t) { return head_->forward(t); }, x);
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
    x = torch::max_pool2d(torch::relu(run("conv1", [&](const at::Tensor& t) { return conv1_->forward(t); }, x)), 2);
    x = torch::max_pool2d(torch::relu(run("conv2", [&](const at::Tensor& t) { return conv2_->forward(t); }, x)), 2);
    x = torch::relu(run("fc", [&](const at::Tensor& t) { return fc_->forward(t); }, x.flatten(1)));
    return run("head", [&](const at::Tensor& t) { return head_->forward(t); }, dropout_->forward(x));
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
    x = torch::relu(run("input", [&](const at::Tensor& t) { return input_->forward(t); }, x.flatten(1)));
    for (size_t i = 0; i < layers_.size(); ++i)
      x = torch::relu(run("layer" + std::to_string(i),
                          [&](const at::Tensor& t) { return layers_[i]->forward(t); }, x));
    return run("head", [&](const at::Tensor& t) { return head_->forward(t); }, x);
  }

 private:
  nn::Linear input_;
  std::vector<nn::Linear> layers_;
  nn::Linear head_{nullptr};
};

// Autocast off for one child, restored on the way out (also on a throw).
class AutocastOff {
 public:
  AutocastOff() : cpu_(at::autocast::is_cpu_enabled()), gpu_(at::autocast::is_enabled()) {
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_enabled(false);
  }
  ~AutocastOff() {
    at::autocast::set_cpu_enabled(cpu_);
    at::autocast::set_enabled(gpu_);
  }

 private:
  bool cpu_, gpu_;
};

// CPU autocast to `dtype` for one forward; the cast cache is dropped after.
class CpuAutocast {
 public:
  explicit CpuAutocast(at::ScalarType dtype) : previous_(at::autocast::get_autocast_cpu_dtype()) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_autocast_cpu_dtype(previous_);
  }

 private:
  at::ScalarType previous_;
};

}  // namespace

void Model::set_fp32_modules(const std::vector<std::string>& names) {
  std::string children;
  for (const auto& child : named_children()) children += (children.empty() ? "" : ", ") + child.key();
  for (const auto& name : names) {
    bool found = false;
    for (const auto& child : named_children()) found |= child.key() == name;
    if (!found)
      throw InputError("precision.fp32_modules names '" + name + "', which this model does not "
                       "have (its modules: " + children + ")");
  }
  fp32_modules_ = names;
}

at::Tensor Model::run(const std::string& name,
                      const std::function<at::Tensor(const at::Tensor&)>& call,
                      const at::Tensor& input) {
  at::Tensor output;
  if (std::find(fp32_modules_.begin(), fp32_modules_.end(), name) != fp32_modules_.end()) {
    AutocastOff off;
    output = call(input.to(at::kFloat));  // the input, before: fp32 resolution inside
  } else {
    output = call(input);
  }
  if (check_overflow_ && first_overflow_.empty() && !torch::isfinite(output).all().item<bool>())
    first_overflow_ = name;
  return output;
}

at::Tensor forward_logits(Model& model, const at::Tensor& images, at::ScalarType autocast) {
  if (autocast == at::kFloat) return model.forward(images);
  at::Tensor logits;
  {
    CpuAutocast scope(autocast);
    logits = model.forward(images);
  }
  return logits.to(at::kFloat);  // the loss in fp32
}

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
