#include "worker/heartbeat.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

namespace lockstep {

HeartbeatLoop::HeartbeatLoop(CoordinatorClient& client, HeartbeatOptions options)
    : client_(client), options_(std::move(options)) {
  latest_.set_run_id(options_.run_id);
  latest_.set_rank(options_.rank);
  latest_.set_generation(options_.generation);
  latest_.set_phase("startup");
  thread_ = std::thread([this] { run(); });
}

HeartbeatLoop::~HeartbeatLoop() { stop(); }

void HeartbeatLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeartbeatLoop::on_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_phase(phase);
}

void HeartbeatLoop::on_step(int64_t step, double loss, double samples_per_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_step(step);
  latest_.set_loss(loss);
  latest_.set_samples_per_s(samples_per_s);
}

void HeartbeatLoop::leave(const std::string& why) {
  spdlog::error("{}", why);
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(1);
}

void HeartbeatLoop::run() {
  using Clock = std::chrono::steady_clock;
  auto last_answer = Clock::now();
  std::string last_error;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    v1::HeartbeatRequest request = latest_;
    lock.unlock();
    v1::HeartbeatReply reply;
    auto deadline = std::min(options_.timeout, std::chrono::milliseconds(5000));
    grpc::Status status = client_.heartbeat(request, &reply, deadline);
    if (status.ok()) {
      last_answer = Clock::now();
      if (reply.command() == v1::HeartbeatReply::ABORT)
        leave("rank " + std::to_string(options_.rank) + ": the coordinator says abort: " +
              reply.reason() + "; leaving the collective now");
      if (reply.command() == v1::HeartbeatReply::STOP && !stop_requested_) {
        spdlog::warn("rank {}: the coordinator asks to stop: {}", options_.rank, reply.reason());
        stop_requested_ = true;
      }
    } else {
      last_error = describe(status);
      double silent = std::chrono::duration<double>(Clock::now() - last_answer).count();
      if (silent * 1000.0 > double(options_.timeout.count()))
        leave("rank " + std::to_string(options_.rank) + ": lost the coordinator at " +
              client_.address() + ": no answer for " + std::to_string(silent).substr(0, 4) +
              " s (fault.heartbeat_timeout_s = " + std::to_string(options_.timeout.count() / 1000.0).substr(0, 4) +
              "; last error " + last_error + "); stopping this worker");
    }
    lock.lock();
    wake_.wait_for(lock, options_.period, [&] { return stopping_; });
  }
}

}  // namespace lockstep
