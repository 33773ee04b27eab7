#include "runtime/data/batches.h"

#include <torch/torch.h>

#include "runtime/data/augment.h"


namespace lockstep {

BatchStream::BatchStream(const Dataset& data, int rank, int world_size, uint64_t seed,
                         int64_t global_batch, int64_t microbatch, int prefetch, int64_t first_step,
                         const Augmenter* augmenter, bool pin_memory)
    : data_(data), sampler_(data.size(), seed, global_batch, microbatch),
      lookup_sampler_(data.size(), seed, global_batch, microbatch),
      per_rank_(sampler_.microbatches_per_step() / world_size), first_index_(rank * per_rank_),
      step_(first_step), augmenter_(augmenter), prefetch_(prefetch), pin_memory_(pin_memory) {
  if (per_rank_ * world_size != sampler_.microbatches_per_step())
    throw std::invalid_argument("BatchStream: world size " + std::to_string(world_size) + " does not divide " +
                                std::to_string(sampler_.microbatches_per_step()) + " microbatches");
  if (prefetch_ > 0) producer_ = std::thread([this] { produce(); });
}

BatchStream::~BatchStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (producer_.joinable()) producer_.join();
}

void BatchStream::produce() {
  try {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || int(ready_.size()) < prefetch_; });
        if (stopping_) return;
      }
      Batch batch = assemble();
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(batch));
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = std::current_exception();
    changed_.notify_all();
  }
}

Batch BatchStream::next() {
  if (prefetch_ <= 0) return assemble();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
  if (ready_.empty()) std::rethrow_exception(failure_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  changed_.notify_all();
  return batch;
}

Batch BatchStream::assemble() {
  const int64_t step = step_, j = first_index_ + local_;
  if (++local_ == per_rank_) local_ = 0, ++step_;
  return build(sampler_, step, j);
}

Batch BatchStream::assemble_at(int64_t step, int64_t j) {
  Batch batch = build(lookup_sampler_, step, j);
  return batch;
}

Batch BatchStream::build(GlobalBatchSampler& sampler, int64_t step, int64_t j) const {
  const std::vector<int64_t> indices = sampler.microbatch(step, j);
  const at::Tensor rows = torch::tensor(indices, torch::kInt64);
  std::vector<int64_t> unreadable;
  at::Tensor inputs = data_.input_rows(rows, &unreadable);
  if (augmenter_ && augmenter_->active())
    inputs = augmenter_->apply(inputs, step * sampler.microbatches_per_step() + j);
  at::Tensor targets = data_.target_rows(rows, unreadable);
  if (pin_memory_) inputs = inputs.pin_memory(), targets = targets.pin_memory();
  return Batch{inputs, targets, sampler.epoch_of(step), step, j};
}

}  // namespace lockstep
