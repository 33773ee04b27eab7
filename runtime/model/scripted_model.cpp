#include "runtime/model/scripted_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

// The first line with something on it (TorchScript's messages may start
// with an empty one), bounded.
std::string first_line(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string::npos) return line.substr(0, 400);
    start = end + 1;
  }
  return "no message";
}

// Why torch::jit::load refused `path`, with the fix. A module scripted by a
// newer PyTorch fails on the first operator this LibTorch lacks
// ("Unknown builtin op: aten::scaled_dot_product_attention." for a 2.x
// Transformer layer in 1.13): that is said as such, not as a damaged file.
std::string load_failure(const std::string& path, const std::string& what) {
  const std::string line = first_line(what);
  const std::string unknown = "Unknown builtin op: ";
  if (const auto at = line.find(unknown); at != std::string::npos) {
    std::string op = line.substr(at + unknown.size());
    if (!op.empty() && op.back() == '.') op.pop_back();
    return "model.path = " + path + " calls the operator " + op + ", which this lockstep's LibTorch (" +
           TORCH_VERSION + ") does not have: the module was scripted by a newer PyTorch. Script it with "
           "PyTorch " + TORCH_VERSION + ", or change the model so that it does not call " + op +
           " (TorchScript's own message: " + line + ")";
  }
  return "model.path = " + path + " is not a TorchScript module this LibTorch (" + TORCH_VERSION +
         ") can load (" + line + "); save one from Python with torch.jit.script(model).save(path)";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

class ScriptedModel : public Model {
 public:
  ScriptedModel(torch::jit::Module module, const ModelSection& section)
      : module_(std::move(module)), path_(section.path), output_key_(section.output) {
    module_.train(true);  // torch::jit::load does not reliably restore the mode
    // The profiling executor runs a module's first calls as loaded, then
    // swaps in a graph it optimised from them (and again when a guard
    // fails): which graph computes a microbatch would then depend on how
    // many calls this process made before it, and under autocast the two
    // round differently. One graph for every call instead.
    torch::jit::setGraphExecutorOptimize(false);
    decisions_.push_back({"torchscript_graph", "as loaded, not re-optimised",
                          "the profiling executor would swap in an optimised graph after a module's first "
                          "calls, so a microbatch's bits would depend on how many calls its process made "
                          "before it (seen in bf16); every call runs the same graph"});
    // One entry per tensor: a weight tied between two layers appears under
    // both names but is one variable, with one gradient.
    std::map<const void*, std::string> first_name;
    std::vector<std::string> frozen;
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) {
      const void* impl = item.value.unsafeGetTensorImpl();
      auto [it, inserted] = first_name.emplace(impl, item.name);
      if (!inserted) {
        decisions_.push_back({"tied_parameter", item.name + " = " + it->second,
                              "the same tensor under two names: one gradient, one all-reduce, one "
                              "update"});
        continue;
      }
      if (!item.value.requires_grad()) {
        frozen.push_back(item.name);
        continue;
      }
      parameters_.emplace_back(item.name, item.value);
    }
    if (!frozen.empty())
      decisions_.push_back({"frozen_parameters", std::to_string(frozen.size()) + " (" + join(frozen) + ")",
                            "requires_grad = False in the saved module: neither all-reduced nor "
                            "updated, kept as saved"});
    if (parameters_.empty())
      throw InputError("model.path = " + path_ + ": the TorchScript module has no trainable "
                       "parameter (" + (frozen.empty() ? std::string("none at all: a torch.jit.freeze-d "
                                                         "module has its weights folded into constants")
                                                     : std::to_string(frozen.size()) +
                                                           " with requires_grad = False") +
                       "); save the module from torch.jit.script(model) before freezing it");
  }

  at::Tensor forward(const at::Tensor& input) override {
    return pick_output(module_.forward({input}));
  }
  NamedTensors parameters() const override { return parameters_; }
  NamedTensors buffers() const override {
    NamedTensors out;
    for (const auto& item : module_.named_buffers(/*recurse=*/true)) out.emplace_back(item.name, item.value);
    return out;
  }
  void train(bool on) override { module_.train(on); }
  bool is_training() const override { return module_.is_training(); }

  void set_fp32_modules(const std::vector<std::string>& names) override {
    if (!names.empty())
      throw InputError("precision.fp32_modules = " + join(names) + " cannot be honoured for " +
                       description() + ": running a submodule with autocast off needs a hook "
                       "around it, and TorchScript drops Python hooks; cast inside the module "
                       "(with torch.autocast(\"cpu\", enabled=False): ...) and leave "
                       "precision.fp32_modules empty");
  }
  void set_overflow_check(bool on) override {
    if (on)
      throw InputError("precision.check_overflow = true cannot be honoured for " + description() +
                       ": finding the first submodule with inf/NaN output needs forward hooks, "
                       "which TorchScript drops; set it to false (non-finite losses and "
                       "gradients are still caught)");
  }

  bool has_own_loss() const override { return module_.find_method("loss").has_value(); }
  at::Tensor own_loss(const at::Tensor& output, const at::Tensor& target) override {
    auto method = module_.find_method("loss");
    if (!method) return Model::own_loss(output, target);
    c10::IValue value = (*method)({output, target});
    if (!value.isTensor())
      throw InputError(description() + ": loss(output, target) returned " +
                       value.tagKind() + ", not a tensor of one loss per sample");
    return value.toTensor();
  }

  std::string saved_bytes() override {
    std::ostringstream bytes;
    module_.save(bytes);
    if (device().is_cpu()) return bytes.str();
    // Trained on CUDA: read back onto the CPU and saved again, so the file
    // loads on a machine without a GPU.
    std::istringstream saved(bytes.str());
    torch::jit::Module on_cpu = torch::jit::load(saved, torch::kCPU);
    std::ostringstream cpu_bytes;
    on_cpu.save(cpu_bytes);
    return cpu_bytes.str();
  }
  void to(const c10::Device& device) override { module_.to(device); }
  std::string description() const override { return "the TorchScript module in " + path_; }
  std::vector<Decision> decisions() const override { return decisions_; }

 private:
  at::Tensor pick_output(const c10::IValue& out) {
    if (out.isTensor()) {
      if (!output_key_.empty())
        throw InputError("model.output = " + output_key_ + ", but " + description() +
                         " returns a tensor; leave model.output empty");
      return out.toTensor();
    }
    if (out.isTuple()) {
      const auto& elements = out.toTupleRef().elements();
      const std::string range = "0.." + std::to_string(int64_t(elements.size()) - 1);
      if (output_key_.empty())
        throw InputError(description() + " returns a tuple of " + std::to_string(elements.size()) +
                         "; set model.output to the index of the element to train on (" + range + ")");
      size_t used = 0;
      int64_t index = -1;
      try {
        index = std::stoll(output_key_, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != output_key_.size() || index < 0 || index >= int64_t(elements.size()))
        throw InputError("model.output = " + output_key_ + ": " + description() + " returns a tuple of " +
                         std::to_string(elements.size()) + " (allowed: " + range + ")");
      return element(elements[size_t(index)], "element " + output_key_);
    }
    if (out.isGenericDict()) {
      std::vector<std::string> keys;
      for (const auto& entry : out.toGenericDict())
        keys.push_back(entry.key().isString() ? entry.key().toStringRef() : "(" + entry.key().tagKind() + ")");
      if (output_key_.empty())
        throw InputError(description() + " returns a dict; set model.output to the key of the "
                         "element to train on (keys: " + join(keys) + ")");
      for (const auto& entry : out.toGenericDict())
        if (entry.key().isString() && entry.key().toStringRef() == output_key_)
          return element(entry.value(), "key " + output_key_);
      throw InputError("model.output = " + output_key_ + " is not a key of the dict " + description() +
                       " returns (keys: " + join(keys) + ")");
    }
    throw InputError(description() + " returns " + out.tagKind() +
                     "; lockstep trains on a tensor, or one element of a tuple or dict (model.output)");
  }

  at::Tensor element(const c10::IValue& value, const std::string& which) {
    if (!value.isTensor())
      throw InputError("model.output = " + output_key_ + ": " + which + " of what " + description() +
                       " returns is " + value.tagKind() + ", not a tensor");
    if (!reported_output_) {
      reported_output_ = true;
      decisions_.push_back({"model_output", which, "model.output picks it from what forward returns"});
    }
    return value.toTensor();
  }

  torch::jit::Module module_;
  std::string path_;
  std::string output_key_;
  NamedTensors parameters_;
  std::vector<Decision> decisions_;
  bool reported_output_ = false;
};

}  // namespace

std::shared_ptr<Model> load_scripted_model(const ModelSection& section) {
  if (section.path.empty())
    throw InputError("model.name = torchscript needs model.path: a file saved from Python with "
                     "torch.jit.script(model).save(\"net.pt\") (tools/lockstep_model.py does it)");
  std::error_code error;
  const auto status = std::filesystem::status(section.path, error);
  if (!std::filesystem::exists(status))
    throw InputError("model.path = " + section.path + ": no such file");
  if (!std::filesystem::is_regular_file(status))
    throw InputError("model.path = " + section.path + ": not a regular file");
  torch::jit::Module module;
  try {
    module = torch::jit::load(section.path, torch::kCPU);
  } catch (const std::exception& e) {
    throw InputError(load_failure(section.path, e.what()));
  }
  return std::make_shared<ScriptedModel>(std::move(module), section);
}

}  // namespace lockstep
