#include "optim/optimizer.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

namespace lockstep::optim {
namespace {

// SGD with momentum (dampening 0), weight decay as L2 on the gradient:
// the update torch.optim.SGD makes, one segment at a time.
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Segment> segments, OptimizerSpec spec)
      : Optimizer(std::move(segments), std::move(spec), 1) {}

  void step() override {
    torch::NoGradGuard no_grad;
    for (size_t s = 0; s < segments_.size(); ++s) {
      at::Tensor& params = segments_[s].params;
      at::Tensor direction = segments_[s].grads;
      if (spec_.weight_decay != 0) direction = direction.add(params, spec_.weight_decay);
      if (spec_.momentum != 0) {
        at::Tensor& momentum = state_[s][0];
        if (steps_ == 0) momentum.copy_(direction);  // the first buffer is the gradient itself
        else momentum.mul_(spec_.momentum).add_(direction);
        direction = spec_.nesterov ? direction.add(momentum, spec_.momentum) : momentum;
      }
      params.add_(direction, -lr_);
    }
    ++steps_;
  }
};

// Adam and AdamW (bias-corrected moments, no amsgrad): the updates
// torch.optim.Adam (weight decay as L2 on the gradient) and
// torch.optim.AdamW (decoupled weight decay) make, one segment at a time.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<Segment> segments, OptimizerSpec spec, bool decoupled)
      : Optimizer(std::move(segments), std::move(spec), 2), decoupled_(decoupled) {}

  void step() override {
    torch::NoGradGuard no_grad;
    const double step = double(steps_ + 1);
    const double correction1 = 1 - std::pow(spec_.beta1, step);
    const double correction2 = 1 - std::pow(spec_.beta2, step);
    for (size_t s = 0; s < segments_.size(); ++s) {
      at::Tensor& params = segments_[s].params;
      at::Tensor grads = segments_[s].grads;
      at::Tensor& mean = state_[s][0];
      at::Tensor& square = state_[s][1];
      if (spec_.weight_decay != 0) {
        if (decoupled_) params.mul_(1 - lr_ * spec_.weight_decay);
        else grads = grads.add(params, spec_.weight_decay);
      }
      mean.mul_(spec_.beta1).add_(grads, 1 - spec_.beta1);
      square.mul_(spec_.beta2).addcmul_(grads, grads, 1 - spec_.beta2);
      at::Tensor denominator = (square.sqrt() / std::sqrt(correction2)).add_(spec_.eps);
      params.addcdiv_(mean, denominator, -lr_ / correction1);
    }
    ++steps_;
  }

 private:
  bool decoupled_;
};

// RMSprop (not centered; optional momentum): the update torch.optim.RMSprop makes.
class RmsProp final : public Optimizer {
 public:
  RmsProp(std::vector<Segment> segments, OptimizerSpec spec)
      : Optimizer(std::move(segments), std::move(spec), 2) {}

  void step() override {
    torch::NoGradGuard no_grad;
    for (size_t s = 0; s < segments_.size(); ++s) {
      at::Tensor& params = segments_[s].params;
      at::Tensor grads = segments_[s].grads;
      at::Tensor& square = state_[s][0];
      at::Tensor& momentum = state_[s][1];
      if (spec_.weight_decay != 0) grads = grads.add(params, spec_.weight_decay);
      square.mul_(spec_.alpha).addcmul_(grads, grads, 1 - spec_.alpha);
      at::Tensor average = square.sqrt().add_(spec_.eps);
      if (spec_.momentum > 0) {
        momentum.mul_(spec_.momentum).addcdiv_(grads, average);
        params.add_(momentum, -lr_);
      } else {
        params.addcdiv_(grads, average, -lr_);
      }
    }
    ++steps_;
  }
};

}  // namespace

Optimizer::Optimizer(std::vector<Segment> segments, OptimizerSpec spec, int slots_per_segment)
    : segments_(std::move(segments)), spec_(std::move(spec)), lr_(spec_.lr) {
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& segment = segments_[s];
    if (segment.params.dim() != 1 || !segment.params.is_contiguous() ||
        !segment.grads.defined() || !segment.grads.sizes().equals(segment.params.sizes()))
      throw std::invalid_argument("optimizer segment " + std::to_string(s) +
                                  ": parameters and gradients must be 1-D, contiguous and of "
                                  "the same length");
    state_.emplace_back();
    for (int k = 0; k < slots_per_segment; ++k)
      state_.back().push_back(torch::zeros_like(segment.params));
  }
}

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write("optimizer", c10::IValue(spec_.name));
  archive.write("steps", c10::IValue(steps_));
  archive.write("segments", c10::IValue(int64_t(state_.size())));
  for (size_t s = 0; s < state_.size(); ++s)
    for (size_t k = 0; k < state_[s].size(); ++k)
      archive.write("state." + std::to_string(s) + "." + std::to_string(k), state_[s][k].to(at::kCPU));  // loads anywhere
}

void Optimizer::load(torch::serialize::InputArchive& archive) {
  c10::IValue name, steps, segments;
  archive.read("optimizer", name);
  archive.read("steps", steps);
  archive.read("segments", segments);
  if (name.toStringRef() != spec_.name)
    throw std::invalid_argument("optimizer state is for '" + name.toStringRef() + "', this run uses '" +
                                spec_.name + "' (optim.name)");
  if (segments.toInt() != int64_t(state_.size()))
    throw std::invalid_argument("optimizer state has " + std::to_string(segments.toInt()) +
                                " segments, this run " + std::to_string(state_.size()) +
                                " (saved by a different version or layout)");
  for (size_t s = 0; s < state_.size(); ++s)
    for (size_t k = 0; k < state_[s].size(); ++k) {
      const std::string key = "state." + std::to_string(s) + "." + std::to_string(k);
      at::Tensor loaded;
      archive.read(key, loaded);
      if (!loaded.sizes().equals(state_[s][k].sizes()))
        throw std::invalid_argument("optimizer state " + key + " has " +
                                    std::to_string(loaded.numel()) + " elements, this model " +
                                    std::to_string(state_[s][k].numel()));
      state_[s][k].copy_(loaded);
    }
  steps_ = steps.toInt();
}

std::vector<uint8_t> Optimizer::save_to_bytes() const {
  torch::serialize::OutputArchive archive;
  save(archive);
  std::vector<uint8_t> bytes;
  archive.save_to([&](const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), p, p + size);
    return size;
  });
  return bytes;
}

void Optimizer::load_from_bytes(const std::vector<uint8_t>& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(reinterpret_cast<const char*>(bytes.data()), bytes.size(), c10::Device(c10::kCPU));
  load(archive);  // copied onto the state's device
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<Segment> segments, const OptimizerSpec& spec) {
  if (spec.name == "sgd") return std::make_unique<Sgd>(std::move(segments), spec);
  if (spec.name == "adamw") return std::make_unique<AdamW>(std::move(segments), spec, true);
  if (spec.name == "adam") return std::make_unique<AdamW>(std::move(segments), spec, false);
  if (spec.name == "rmsprop") return std::make_unique<RmsProp>(std::move(segments), spec);
  throw std::invalid_argument("unknown optimizer '" + spec.name +
                              "' (allowed: sgd, adamw, adam, rmsprop)");
}

double scheduled_lr(const ScheduleSpec& spec, int64_t step) {
  if (spec.warmup_steps > 0 && step < spec.warmup_steps)
    return spec.base_lr * double(step + 1) / double(spec.warmup_steps);
  if (spec.kind == "cosine") {
    const double span = double(std::max<int64_t>(1, spec.total_steps - spec.warmup_steps));
    const double progress = std::min(1.0, double(step - spec.warmup_steps) / span);
    return 0.5 * spec.base_lr * (1.0 + std::cos(M_PI * progress));
  }
  return spec.base_lr;
}

}  // namespace lockstep::optim
