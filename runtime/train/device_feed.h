#pragma once
// Training batches on the model's device. On the CPU they pass through.
// On CUDA the batch stream pins them in host memory (off the training
// thread) and the next batch's copy to the GPU runs on a stream of its own
// while the current one computes; a batch is handed out only once its copy
// is complete as far as the computing stream can tell.
#include <memory>

#include <c10/core/Device.h>

#include "runtime/data/batches.h"

namespace lockstep {

class DeviceFeed {
 public:
  // `stream` must outlive the feed; on CUDA it must pin its batches.
  DeviceFeed(BatchStream& stream, const c10::Device& device);
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;
  // The next batch, on the device. One batch ahead is taken from the stream.
  Batch next();

 private:
  struct CudaCopies;
  BatchStream& stream_;
  c10::Device device_;
  std::unique_ptr<CudaCopies> cuda_;  // null on the CPU
};

}  // namespace lockstep
