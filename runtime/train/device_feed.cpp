#include "runtime/train/device_feed.h"

#include <optional>
#include <stdexcept>

#include "lockstep/build_config.h"

#if LOCKSTEP_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lockstep {

#if LOCKSTEP_HAS_CUDA
struct DeviceFeed::CudaCopies {
  explicit CudaCopies(const c10::Device& device)
      : copies(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
  c10::cuda::CUDAStream copies;
  std::optional<Batch> ahead;    // its copy issued on `copies`
  at::cuda::CUDAEvent copied;    // recorded on `copies` after that copy
};
#else
struct DeviceFeed::CudaCopies {};
#endif

DeviceFeed::DeviceFeed(BatchStream& stream, const c10::Device& device) : stream_(stream), device_(device) {
  if (!device_.is_cuda()) return;
#if LOCKSTEP_HAS_CUDA
  cuda_ = std::make_unique<CudaCopies>(device_);
#else
  throw std::logic_error("DeviceFeed: a CUDA device in a build without CUDA");
#endif
}

DeviceFeed::~DeviceFeed() = default;

Batch DeviceFeed::next() {
  if (!cuda_) return stream_.next();
#if LOCKSTEP_HAS_CUDA
  auto start_copy = [&] {
    Batch host = stream_.next();  // pinned by the stream's producer
    c10::cuda::CUDAStreamGuard on_copies(cuda_->copies);
    cuda_->ahead = host;
    cuda_->ahead->inputs = host.inputs.to(device_, /*non_blocking=*/true);
    cuda_->ahead->targets = host.targets.to(device_, /*non_blocking=*/true);
    cuda_->copied.record(cuda_->copies);  // the pinned source stays alive until then (the host allocator's events)
  };
  if (!cuda_->ahead) start_copy();
  Batch batch = std::move(*cuda_->ahead);
  cuda_->ahead.reset();
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  cuda_->copied.block(compute);
  // Allocated on the copy stream, used on the computing one: the memory is
  // not reused before the computing stream is done with it.
  batch.inputs.record_stream(compute);
  batch.targets.record_stream(compute);
  start_copy();  // the following batch travels while this one computes
  return batch;
#else
  return stream_.next();
#endif
}

}  // namespace lockstep
