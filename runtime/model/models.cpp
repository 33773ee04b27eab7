#include "runtime/model/models.h"

#include <sstream>

#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"
#include "runtime/model/scripted_model.h"

namespace lockstep {
namespace {

namespace nn = torch::nn;

// 784-256-128-10 with ReLU.
class Mlp : public NativeModule {
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
  std::string torchscript_forward() const override {
    return "def forward(self, x):\n"
           "    x = torch.flatten(x, 1)\n"
           "    x = torch.relu(torch.linear(x, self.fc1.weight, self.fc1.bias))\n"
           "    x = torch.relu(torch.linear(x, self.fc2.weight, self.fc2.bias))\n"
           "    return torch.linear(x, self.head.weight, self.head.bias)\n";
  }

 private:
  nn::Linear fc1_, fc2_, head_;
};

// Two 3x3 conv + max-pool blocks (32, 64 channels), fc 128, dropout, fc 10.
class Cnn : public NativeModule {
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
  std::string torchscript_forward() const override {
    // A float literal whatever the value: TorchScript reads "0" as an int.
    std::string p = fmt::format("{:.17g}", dropout_->options.p());
    if (p.find_first_of(".en") == std::string::npos) p += ".0";
    return "def forward(self, x):\n"
           "    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv1.weight, self.conv1.bias, [1, 1], [1, 1])), [2, 2])\n"
           "    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv2.weight, self.conv2.bias, [1, 1], [1, 1])), [2, 2])\n"
           "    x = torch.relu(torch.linear(torch.flatten(x, 1), self.fc.weight, self.fc.bias))\n"
           "    x = torch.dropout(x, " + p + ", self.training)\n"
           "    return torch.linear(x, self.head.weight, self.head.bias)\n";
  }

 private:
  nn::Conv2d conv1_, conv2_;
  nn::Linear fc_;
  nn::Dropout dropout_;
  nn::Linear head_;
};

// 784 -> 64, then 24 Linear(64, 64) layers, then 64 -> 10: many small
// gradients, so per-tensor overheads dominate.
class DeepNarrowMlp : public NativeModule {
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
  std::string torchscript_forward() const override {
    std::string source = "def forward(self, x):\n"
                         "    x = torch.relu(torch.linear(torch.flatten(x, 1), self.input.weight, self.input.bias))\n";
    for (size_t i = 0; i < layers_.size(); ++i)
      source += "    x = torch.relu(torch.linear(x, self.layer" + std::to_string(i) + ".weight, self.layer" +
                std::to_string(i) + ".bias))\n";
    return source + "    return torch.linear(x, self.head.weight, self.head.bias)\n";
  }

 private:
  nn::Linear input_;
  std::vector<nn::Linear> layers_;
  nn::Linear head_{nullptr};
};

// Autocast off for one child on the CPU and CUDA, restored on the way out
// (also on a throw).
class AutocastOff {
 public:
  AutocastOff()
      : cpu_(at::autocast::is_autocast_enabled(at::kCPU)), cuda_(at::autocast::is_autocast_enabled(at::kCUDA)) {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
  }
  ~AutocastOff() {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_);
  }

 private:
  bool cpu_, cuda_;
};

// Autocast to `dtype` on `device` (the CPU or CUDA) for one forward; the
// cast cache is dropped after.
class Autocast {
 public:
  Autocast(c10::DeviceType device, at::ScalarType dtype)
      : device_(device), previous_(at::autocast::get_autocast_dtype(device)) {
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, false);
    at::autocast::set_autocast_dtype(device_, previous_);
  }

 private:
  c10::DeviceType device_;
  at::ScalarType previous_;
};

}  // namespace

void NativeModule::set_fp32_modules(const std::vector<std::string>& names) {
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

at::Tensor NativeModule::run(const std::string& name,
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

at::Tensor forward_output(Model& model, const at::Tensor& input, at::ScalarType autocast) {
  if (autocast == at::kFloat) return model.forward(input);
  at::Tensor output;
  {
    Autocast scope(input.device().type(), autocast);
    output = model.forward(input);
  }
  return output.to(at::kFloat);  // the loss in fp32
}

void run_model_call(const std::string& where, const std::string& precision, const Model& model,
                    const std::function<void()>& call) {
  try {
    call();
  } catch (const RunError&) {
    throw;
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw ModelFailure(fmt::format("{} (precision {}) failed in {}: {}", where, precision, model.description(),
                                   error_line(e.what())),
                       e.what());
  }
}

at::ScalarType autocast_dtype(const std::string& precision) {
  if (precision == "bf16") return at::kBFloat16;
  if (precision == "fp16") return at::kHalf;
  return at::kFloat;
}

c10::Device Model::device() const {
  const NamedTensors trainable = parameters();
  return trainable.empty() ? c10::Device(c10::kCPU) : trainable.front().second.device();
}

at::Tensor Model::own_loss(const at::Tensor&, const at::Tensor&) {
  throw InputError("loss.name = model needs a model with a loss(output, target) method; " +
                   description() + " has none");
}

namespace {

class NativeModel : public Model {
 public:
  NativeModel(std::shared_ptr<NativeModule> module, std::string name)
      : module_(std::move(module)), name_(std::move(name)) {}

  at::Tensor forward(const at::Tensor& input) override { return module_->forward(input); }
  NamedTensors parameters() const override {
    NamedTensors out;
    for (const auto& item : module_->named_parameters())
      if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors buffers() const override {
    NamedTensors out;
    for (const auto& item : module_->named_buffers()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void train(bool on) override { module_->train(on); }
  bool is_training() const override { return module_->is_training(); }
  void set_fp32_modules(const std::vector<std::string>& names) override {
    module_->set_fp32_modules(names);
  }
  void set_overflow_check(bool on) override { module_->set_overflow_check(on); }
  std::string take_overflow() override {
    std::string first = module_->first_overflow();
    module_->clear_overflow();
    return first;
  }
  // A TorchScript module: one submodule per child holding its parameters
  // and buffers under their names (the layout torch::save writes, so
  // torch::load reads it back into the C++ module), and the forward as
  // TorchScript source.
  std::string saved_bytes() override {
    auto unit = std::make_shared<torch::jit::CompilationUnit>();
    auto with_training = [&](const std::string& type) {
      torch::jit::Module m(c10::QualifiedName("__torch__.lockstep." + type), unit, /*shouldMangle=*/true);
      m.register_attribute("training", c10::BoolType::get(), false);
      return m;
    };
    torch::jit::Module top = with_training(name_);
    for (const auto& child : module_->named_children()) {
      torch::jit::Module sub = with_training(name_ + "_" + child.key());
      for (const auto& p : child.value()->named_parameters(/*recurse=*/false))
        sub.register_parameter(p.key(), p.value().detach().to(at::kCPU, false, /*copy=*/true), /*is_buffer=*/false);
      for (const auto& b : child.value()->named_buffers(/*recurse=*/false))
        sub.register_buffer(b.key(), b.value().detach().to(at::kCPU, false, /*copy=*/true));
      top.register_module(child.key(), sub);
    }
    if (const std::string source = module_->torchscript_forward(); !source.empty())
      top.define(source);
    else
      spdlog::warn("model-final.pt of {} holds its parameters but no forward (the model has no "
                   "torchscript_forward()): torch.jit.load gives a module that cannot be called", description());
    top.eval();
    std::ostringstream bytes;
    top.save(bytes);
    return bytes.str();
  }
  std::string description() const override { return "the built-in " + name_; }
  void to(const c10::Device& device) override { module_->to(device); }

  std::shared_ptr<NativeModule> module() const { return module_; }

 private:
  std::shared_ptr<NativeModule> module_;
  std::string name_;
};

}  // namespace

std::shared_ptr<Model> wrap_native(std::shared_ptr<NativeModule> module, const std::string& name) {
  return std::make_shared<NativeModel>(std::move(module), name);
}

std::shared_ptr<NativeModule> native_module(const std::shared_ptr<Model>& model) {
  auto native = std::dynamic_pointer_cast<NativeModel>(model);
  return native ? native->module() : nullptr;
}

ModelRegistry ModelRegistry::with_builtins() {
  ModelRegistry registry;
  registry.add("mlp", [](const ModelSection&) { return wrap_native(std::make_shared<Mlp>(), "mlp"); });
  registry.add("cnn", [](const ModelSection& m) {
    return wrap_native(std::make_shared<Cnn>(m.dropout), "cnn");
  });
  registry.add("deep_mlp", [](const ModelSection&) {
    return wrap_native(std::make_shared<DeepNarrowMlp>(), "deep_mlp");
  });
  registry.add("torchscript", [](const ModelSection& m) { return load_scripted_model(m); });
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
    throw InputError("model.name = " + model.name + " is not registered (allowed: " + known +
                     "); a PyTorch model of your own: save it with python/lockstep_model.py and "
                     "set model.name = torchscript, model.path = FILE (docs/model.md)");
  }
  return it->second(model);
}

}  // namespace lockstep
