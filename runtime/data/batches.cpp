#include "runtime/data/batches.h"

#include <torch/torch.h>

#include "runtime/data/augment.h"


namespace lockstep {

BatchStream::BatchStream(const Dataset& data, int rank, int world_size, uint64_t seed,
                         int64_t batch_size, int prefetch, int64_t skip, const Augmenter* augmenter,
                         bool pin_memory)
    : data_(data), sampler_(data.size(), rank, world_size, seed), batch_size_(batch_size),
      augmenter_(augmenter), next_index_(skip), prefetch_(prefetch), pin_memory_(pin_memory) {
  start_epoch(skip / batches_per_epoch());
  position_ = (skip % batches_per_epoch()) * batch_size_;
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

void BatchStream::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  order_ = torch::tensor(sampler_.indices(epoch), torch::kInt64);
  position_ = 0;
}

int64_t BatchStream::batches_per_epoch() const {
  return (sampler_.samples_per_rank() + batch_size_ - 1) / batch_size_;
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
  if (position_ >= order_.numel()) start_epoch(epoch_ + 1);
  int64_t count = std::min(batch_size_, order_.numel() - position_);
  at::Tensor rows = order_.narrow(0, position_, count);
  position_ += count;
  std::vector<int64_t> unreadable;
  at::Tensor inputs = data_.input_rows(rows, &unreadable);
  if (augmenter_ && augmenter_->active()) inputs = augmenter_->apply(inputs, next_index_);
  ++next_index_;
  at::Tensor targets = data_.target_rows(rows, unreadable);
  if (pin_memory_) return Batch{inputs.pin_memory(), targets.pin_memory(), epoch_};
  return Batch{inputs, targets, epoch_};
}

}  // namespace lockstep
