#include "runtime/train/recompute.h"

#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "runtime/audit/seeding.h"

namespace lockstep {
namespace {

// The default generators' states, put back when this goes out of scope:
// the recomputation draws from the owner's stream, not from this rank's.
class RandomStateKept {
 public:
  explicit RandomStateKept(const c10::Device& device) {
    cpu_ = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpu_.mutex());
      cpu_state_ = cpu_.get_state();
    }
    if (device.is_cuda()) {
      device_ = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(device_->mutex());
      device_state_ = device_->get_state();
    }
  }
  ~RandomStateKept() {
    {
      std::lock_guard<std::mutex> lock(cpu_.mutex());
      cpu_.set_state(cpu_state_);
    }
    if (device_) {
      std::lock_guard<std::mutex> lock(device_->mutex());
      device_->set_state(device_state_);
    }
  }
  RandomStateKept(const RandomStateKept&) = delete;
  RandomStateKept& operator=(const RandomStateKept&) = delete;

 private:
  at::Generator cpu_;
  at::Tensor cpu_state_, device_state_;
  std::optional<at::Generator> device_;
};

}  // namespace

std::vector<at::Tensor> current_gradients(const NamedTensors& parameters) {
  std::vector<at::Tensor> gradients;
  gradients.reserve(parameters.size());
  for (const auto& [name, p] : parameters) gradients.push_back(p.grad());
  return gradients;
}

Recomputed recompute_microbatch(Model& model, const Objective& objective, const NamedTensors& parameters,
                                const Batch& batch, int64_t step, uint64_t seed, at::ScalarType autocast,
                                double loss_scale) {
  RandomStateKept kept(model.device());
  seed_everything(seed);
  const MaskedLoss loss = objective.loss(forward_output(model, batch.inputs, autocast), batch.targets);
  (void)model.take_overflow();  // the owner's forward reported its own
  std::vector<at::Tensor> inputs;
  for (const auto& [name, p] : parameters) inputs.push_back(p);
  const at::Tensor scaled = loss_scale != 1.0 ? loss.sum * loss_scale : loss.sum;
  // Gradients without accumulating into .grad: the reducer's buckets and
  // hooks stay as the step left them.
  std::vector<at::Tensor> grads = torch::autograd::grad({scaled}, inputs, /*grad_outputs=*/{},
                                                        /*retain_graph=*/false, /*create_graph=*/false,
                                                        /*allow_unused=*/true);
  Recomputed out;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < grads.size(); ++i) {
    // As the owner's: accumulated into a zeroed buffer (0 + g: a -0 becomes +0).
    at::Tensor accumulated = torch::zeros_like(parameters[i].second);
    if (grads[i].defined()) accumulated.add_(grads[i]);
    out.gradients.push_back(accumulated);
  }
  out.digest = digest_microbatch(step, batch.microbatch, out.gradients, loss.sum.item<double>(), double(loss.valid));
  return out;
}

}  // namespace lockstep
