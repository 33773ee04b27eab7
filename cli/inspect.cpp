// The commands that look at a job without changing it: status (live, or
// from a run folder), config and keys.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "runtime/job/config.h"
#include "runtime/base/errors.h"
#include "runtime/run/run_folder.h"
#include "runtime/base/untrusted_json.h"
#include "worker/coordinator_client.h"

namespace lockstep {

int config_command(const std::string& job_file, const std::vector<std::string>& overrides, bool json) {
  spdlog::set_level(spdlog::level::warn);  // stdout is the configuration; decisions are in its comments
  const JobConfig config = load_job_config(job_file, overrides);
  if (json) {
    std::printf("%s\n", nlohmann::json({{"config", to_json(config)}, {"sources", config.sources}}).dump(1).c_str());
    return 0;
  }
  std::string text = effective_toml(config);
  for (const auto& d : config.decisions) text += "# Decision: " + d.what + " = " + d.value + " (" + d.reason + ")\n";
  std::fputs(text.c_str(), stdout);
  return 0;
}

int keys_command(bool json) {
  const nlohmann::json keys = describe_keys();
  if (json) {
    std::printf("%s\n", keys.dump(1).c_str());
    return 0;
  }
  size_t width = 0;
  for (const auto& k : keys) width = std::max(width, k["key"].get<std::string>().size());
  for (const auto& k : keys)
    std::printf("%-*s  %-8s default %-12s %s\n", int(width), k["key"].get<std::string>().c_str(),
                k["type"].get<std::string>().c_str(), k["default"].get<std::string>().c_str(),
                k["allowed"].get<std::string>().c_str());
  return 0;
}

nlohmann::json status_json(const v1::StatusReply& reply) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : reply.ranks())
    ranks.push_back({{"rank", r.rank()}, {"host", r.host()}, {"pid", r.pid()},
                     {"step", int64_t(r.step())}, {"loss", r.loss()},
                     {"samples_per_s", r.samples_per_s()}, {"heartbeat_age_s", r.heartbeat_age_s()},
                     {"state", r.state()}, {"phase", r.phase()}, {"audit", r.audit()},
                     {"skipped_steps", r.skipped_steps()}});
  return {{"run_id", reply.run_id()},         {"state", reply.state()},
          {"world_size", reply.world_size()}, {"joined", reply.joined()},
          {"generation", int64_t(reply.generation())}, {"restarts", reply.restarts()},
          {"max_restarts", reply.max_restarts()}, {"failure", reply.failure()},
          {"last_audit", reply.last_audit()}, {"last_eval", reply.last_eval()},
          {"bad_files_skipped", reply.bad_files_skipped()}, {"audits", reply.audits()},
          {"audit_disagreements", reply.audit_disagreements()}, {"first_drift_step", reply.first_drift_step()},
          {"total_steps", reply.total_steps()}, {"eta_s", reply.eta_s()},
          {"skipped_steps", reply.skipped_steps()},
          {"ranks", ranks}};
}

namespace {

using std::chrono::milliseconds;

std::string duration_text(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

void print_status(const v1::StatusReply& reply) {
  std::printf("run %s: %s, generation %lld (restarts %d of %d allowed), %d of %d joined%s%s\n",
              reply.run_id().c_str(), reply.state().c_str(),
              static_cast<long long>(reply.generation()), reply.restarts(), reply.max_restarts(),
              reply.joined(), reply.world_size(), reply.failure().empty() ? "" : "\nfailure: ",
              reply.failure().c_str());
  if (reply.total_steps() > 0) {
    int64_t slowest = reply.total_steps();
    for (const auto& r : reply.ranks()) slowest = std::min<int64_t>(slowest, r.step());
    std::printf("progress: step %lld of %lld (%.0f%%), ETA %s\n", static_cast<long long>(slowest),
                static_cast<long long>(reply.total_steps()), 100.0 * double(slowest) / double(reply.total_steps()),
                reply.eta_s() >= 0 ? duration_text(reply.eta_s()).c_str() : "not yet known");
  }
  if (!reply.last_audit().empty()) std::printf("last audit: %s\n", reply.last_audit().c_str());
  if (!reply.last_eval().empty()) std::printf("last eval: %s\n", reply.last_eval().c_str());
  if (reply.skipped_steps() > 0)
    std::printf("skipped steps: %lld (trained nothing: the gradient scaler found inf/NaN, or no valid target)\n",
                static_cast<long long>(reply.skipped_steps()));
  if (reply.bad_files_skipped() > 0)
    std::printf("bad files skipped: %lld (data.bad_files = skip; listed in the run's manifest.json)\n",
                static_cast<long long>(reply.bad_files_skipped()));
  std::printf("%4s  %-20s %8s %8s %9s %10s %8s  %s\n", "rank", "host", "pid", "step", "loss",
              "samples/s", "hb age", "state");
  for (const auto& r : reply.ranks())
    std::printf("%4d  %-20s %8d %8lld %9.4f %10.0f %7.1fs  %s (%s)\n", r.rank(), r.host().c_str(),
                r.pid(), static_cast<long long>(r.step()), r.loss(), r.samples_per_s(),
                r.heartbeat_age_s(), r.state().c_str(), r.phase().c_str());
}

// A finished run's outcome from its manifest: the state and why, how far
// it got, each restart (the rank that died, the step resumed from, the
// steps redone, how long it took) and each rank's last state. Every field
// read as what it should be, or left out: the manifest is a file anyone
// may have edited.
void print_finished(const nlohmann::json& manifest, const std::string& run_dir, bool json) {
  auto text = [](const nlohmann::json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto number = [](const nlohmann::json& o, const char* key, double fallback) {
    auto it = o.find(key);
    return it != o.end() && it->is_number() ? it->get<double>() : fallback;
  };
  nlohmann::json restarts = nlohmann::json::array(), ranks = nlohmann::json::array();
  if (auto r = manifest.find("restarts"); r != manifest.end() && r->is_array())
    for (const auto& restart : *r)
      if (restart.is_object())
        restarts.push_back({{"generation", int64_t(number(restart, "generation", 0))},
                            {"dead_rank", int64_t(number(restart, "dead_rank", -1))},
                            {"during", text(restart, "during")},
                            {"resumed_from_step", int64_t(number(restart, "resumed_from_step", -1))},
                            {"steps_redone", int64_t(number(restart, "steps_redone", -1))},
                            {"recovery_s", number(restart, "recovery_s", -1)},
                            {"reason", text(restart, "reason")}});
  // An elastic job's world size over time: each generation after the first.
  nlohmann::json membership = nlohmann::json::array();
  if (auto c = manifest.find("coordinator"); c != manifest.end() && c->is_object())
    if (auto m = c->find("membership"); m != c->end() && m->is_array())
      for (const auto& change : *m)
        if (change.is_object())
          membership.push_back({{"generation", int64_t(number(change, "generation", 0))},
                                {"step", int64_t(number(change, "resumed_from_step", number(change, "step", -1)))},
                                {"recovery_s", number(change, "recovery_s", -1)},
                                {"world_size_before", int64_t(number(change, "world_size_before", 0))},
                                {"world_size", int64_t(number(change, "world_size", 0))},
                                {"kind", text(change, "kind")},
                                {"seconds_to_new_generation", number(change, "seconds_to_new_generation", -1)},
                                {"reason", text(change, "reason")}});
  if (auto c = manifest.find("coordinator"); c != manifest.end() && c->is_object())
    if (auto w = c->find("workers"); w != c->end() && w->is_array())
      for (const auto& worker : *w)
        if (worker.is_object())
          ranks.push_back({{"rank", int64_t(number(worker, "rank", -1))}, {"host", text(worker, "host")},
                           {"state", text(worker, "state")}, {"step", int64_t(number(worker, "last_step", 0))}});
  const std::string state = text(manifest, "status"), error = text(manifest, "error");
  if (json) {
    std::printf("%s\n", nlohmann::json({{"run_id", text(manifest, "run_id")}, {"state", state}, {"running", false},
                                         {"failure", error}, {"restarts", restarts}, {"membership", membership},
                                         {"ranks", ranks}})
                            .dump(2)
                            .c_str());
    return;
  }
  std::printf("run %s: %s, not running (no coordinator address in %s; its manifest says so)\n",
              text(manifest, "run_id").c_str(), state.empty() ? "?" : state.c_str(), run_dir.c_str());
  if (!error.empty()) std::printf("error: %s\n", error.c_str());
  for (const auto& r : restarts) {
    const int64_t rank = r["dead_rank"], redone = r["steps_redone"], resumed = r["resumed_from_step"];
    const double seconds = r["recovery_s"];
    std::printf("restart to generation %lld: %s%s; %s%s%s\n", static_cast<long long>(r["generation"].get<int64_t>()),
                rank >= 0 ? ("rank " + std::to_string(rank) + " lost").c_str() : "a worker lost before it had a rank",
                r["during"] == "the rendezvous" ? " during the rendezvous" : "",
                resumed >= 0 ? ("resumed from step " + std::to_string(resumed)).c_str() : "no step trained after it",
                redone >= 0 ? (", " + std::to_string(redone) + " steps redone").c_str() : "",
                seconds >= 0 ? fmt::format(", recovery {:.2f} s", seconds).c_str() : "");
  }
  for (const auto& m : membership) {
    const double seconds = m["recovery_s"];
    std::printf("generation %lld from step %lld: %lld -> %lld ranks (%s: %s)%s\n",
                static_cast<long long>(m["generation"].get<int64_t>()), static_cast<long long>(m["step"].get<int64_t>()),
                static_cast<long long>(m["world_size_before"].get<int64_t>()),
                static_cast<long long>(m["world_size"].get<int64_t>()), m["kind"].get<std::string>().c_str(),
                m["reason"].get<std::string>().c_str(),
                seconds >= 0 ? fmt::format("; {:.2f} s from the end of the last generation to the first step", seconds).c_str()
                             : "");
  }
  for (const auto& r : ranks)
    std::printf("rank %lld (%s): %s at step %lld\n", static_cast<long long>(r["rank"].get<int64_t>()),
                r["host"].get<std::string>().c_str(), r["state"].get<std::string>().c_str(),
                static_cast<long long>(r["step"].get<int64_t>()));
}

}  // namespace

int status_command(ConnectionFlags connection, const std::string& run_dir, bool json, bool watch) {
  if (!run_dir.empty() && connection.coordinator.empty()) {
    const std::string address_file = run_dir + "/" + kAddressFile;
    if (!std::filesystem::exists(address_file)) {
      const std::string manifest_path = run_dir + "/manifest.json";
      if (!std::filesystem::exists(manifest_path))
        throw InputError(run_dir + ": not a run folder (no manifest.json, no " + kAddressFile + ")");
      std::string why;
      const auto manifest = parse_untrusted_json(read_text_file(manifest_path, "the manifest", 64 << 20), &why);
      if (!manifest.is_object())
        throw InputError(manifest_path + ": not a readable manifest (" + (why.empty() ? "not a JSON object" : why) + ")");
      print_finished(manifest, run_dir, json);
      return 0;
    }
    connection.coordinator = read_text_file(address_file, "the coordinator address", 4096);
    if (connection.token_file.empty() && !std::getenv("LOCKSTEP_TOKEN"))
      connection.token_file = run_dir + "/" + kTokenFile;
  }
  if (connection.coordinator.empty())
    throw InputError("lockstep status needs --coordinator HOST:PORT, or the RUN_DIR of a `lockstep run` job");
  check_connection(connection);
  CoordinatorClient client({connection.coordinator, resolve_token(connection.token_file),
                            connection.tls_ca});
  const bool terminal = ::isatty(STDOUT_FILENO);
  for (;;) {
    v1::StatusReply reply;
    grpc::Status status = client.status(&reply, milliseconds(5000));
    if (!status.ok()) {
      // Under --watch a job that ended and took its coordinator along is the end of watching.
      if (watch && (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    status.error_code() == grpc::StatusCode::CANCELLED)) {
        std::printf("the coordinator at %s is gone: the job has ended%s\n", connection.coordinator.c_str(),
                    run_dir.empty() ? "" : (" (lockstep status " + run_dir + " shows its outcome)").c_str());
        return 0;
      }
      throw RunError("cannot get the status from " + connection.coordinator + ": " + describe(status));
    }
    if (json) {
      std::printf("%s\n", status_json(reply).dump(watch ? -1 : 2).c_str());
    } else {
      if (watch && terminal) std::printf("\x1b[H\x1b[2J");  // redraw in place
      print_status(reply);
    }
    std::fflush(stdout);
    if (!watch || (reply.state() != "waiting" && reply.state() != "running")) return 0;
    std::this_thread::sleep_for(milliseconds(1000));
    if (!terminal && !json) std::printf("\n");
  }
}

}  // namespace lockstep
