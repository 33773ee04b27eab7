#include "worker/heartbeat.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "runtime/run/generation.h"

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

bool HeartbeatLoop::stop_requested() {
  if (!stop_requested_ && options_.stop_signal && options_.stop_signal->load()) {
    stop_requested_ = true;
    spdlog::warn("rank {}: SIGUSR1: every rank stops after a step they agree on, with a "
                 "checkpoint there", options_.rank);
  }
  return stop_requested_;
}

bool HeartbeatLoop::regroup_requested() {
  if (regroup_requested_) return true;
  v1::HeartbeatRequest request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request = latest_;
  }
  v1::HeartbeatReply reply;
  if (client_.heartbeat(request, &reply, std::min(options_.timeout, std::chrono::milliseconds(5000))).ok() &&
      reply.command() == v1::HeartbeatReply::REGROUP) {
    spdlog::warn("rank {}: the stop the ranks agreed on is the coordinator's regroup: {}", options_.rank, reply.reason());
    regroup_requested_ = true;
  }
  return regroup_requested_;
}

void HeartbeatLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // One last heartbeat carries the audits of the final steps and the final evaluation.
  std::lock_guard<std::mutex> lock(mutex_);
  if (unsent_audits_.empty() && !eval_unsent_) return;
  v1::HeartbeatRequest request = latest_;
  for (auto& audit : unsent_audits_) request.add_audits_json(audit);
  v1::HeartbeatReply reply;
  if (client_.heartbeat(request, &reply, std::chrono::milliseconds(5000)).ok()) {
    unsent_audits_.clear();
    eval_unsent_ = false;
  }
}

bool HeartbeatLoop::wait_for_generation_end(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return verdict_.wait_for(lock, timeout, [] { return generation_ended(); });
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

void HeartbeatLoop::on_total_steps(int64_t total) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_total_steps(total);
}

void HeartbeatLoop::on_eval(const std::string& summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_eval(summary.substr(0, 1000));
  eval_unsent_ = true;
}

void HeartbeatLoop::on_skipped_files(int64_t before_training, int64_t in_batches) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_files_skipped_before_training(before_training);
  latest_.set_files_skipped_in_batches(in_batches);
}

void HeartbeatLoop::on_skipped_steps(int64_t total) {
  std::lock_guard<std::mutex> lock(mutex_);
  latest_.set_skipped_steps(total);
}

void HeartbeatLoop::on_audit(const nlohmann::json& summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  unsent_audits_.push_back(summary.dump());
  latest_.set_audit("step " + std::to_string(summary.value("step", int64_t(0))) + ": " +
                    summary.value("verdict", std::string("?")));
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
  Clock::time_point told_to_rejoin{};
  std::string last_error;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    v1::HeartbeatRequest request = latest_;
    for (auto& audit : unsent_audits_) request.add_audits_json(audit);
    const size_t sending = unsent_audits_.size();
    const std::string eval_sent = request.eval();
    lock.unlock();
    v1::HeartbeatReply reply;
    auto deadline = std::min(options_.timeout, std::chrono::milliseconds(5000));
    grpc::Status status = client_.heartbeat(request, &reply, deadline);
    if (status.ok()) {
      last_answer = Clock::now();
      {
        std::lock_guard<std::mutex> sent(mutex_);
        unsent_audits_.erase(unsent_audits_.begin(), unsent_audits_.begin() + long(sending));
        if (latest_.eval() == eval_sent) eval_unsent_ = false;
      }
      if (reply.command() == v1::HeartbeatReply::ABORT)
        leave("rank " + std::to_string(options_.rank) + ": the coordinator says abort: " +
              reply.reason() + "; leaving the collective now");
      if (reply.command() == v1::HeartbeatReply::REJOIN) {
        if (!generation_ended()) {
          spdlog::warn("rank {}: the coordinator restarts the job: {}; unwinding to join again "
                       "from this process", options_.rank, reply.reason());
          told_to_rejoin = Clock::now();
          {
            std::lock_guard<std::mutex> ended(mutex_);
            end_generation(reply.reason());
          }
          verdict_.notify_all();
        } else if (Clock::now() - told_to_rejoin > options_.rejoin_grace) {
          leave("rank " + std::to_string(options_.rank) + ": told to rejoin " +
                std::to_string(options_.rejoin_grace.count() / 1000) + " s ago, but the "
                "training thread is still blocked (in a collective with the lost peer?); "
                "ending this process so that a replacement can join");
        }
      }
      if (reply.command() == v1::HeartbeatReply::REGROUP && !regroup_requested_) {
        spdlog::warn("rank {}: the coordinator regroups the job: {}; stopping after a step every rank "
                     "agrees on, keeping the state in memory", options_.rank, reply.reason());
        regroup_requested_ = true;
        stop_requested_ = true;
      }
      if (reply.command() == v1::HeartbeatReply::STOP && !stop_requested_) {
        spdlog::warn("rank {}: the coordinator asks to stop: {}", options_.rank, reply.reason());
        stop_requested_ = true;
      }
    } else {
      last_error = describe(status);
      double silent = std::chrono::duration<double>(Clock::now() - last_answer).count();
      if (silent * 1000.0 > double(options_.timeout.count())) {
        const std::string why = "rank " + std::to_string(options_.rank) + ": lost the coordinator at " +
              client_.address() + ": no answer for " + std::to_string(silent).substr(0, 4) +
              " s (fault.heartbeat_timeout_s = " + std::to_string(options_.timeout.count() / 1000.0).substr(0, 4) +
              "; last error " + last_error + "); stopping this worker";
        if (options_.on_coordinator_lost) options_.on_coordinator_lost(why);
        leave(why);
      }
    }
    lock.lock();
    wake_.wait_for(lock, options_.period, [&] { return stopping_; });
  }
}

}  // namespace lockstep
