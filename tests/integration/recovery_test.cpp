// Automatic recovery in `lockstep run`: a worker killed (SIGKILL) at a
// random step costs a restart from the newest checkpoint, never the run (the
// survivor rejoins from its own process, the dead one is replaced), and
// the run ends with the parameters of one that was never interrupted; a
// second failure with fault.max_restarts = 1 ends the job, saying the budget
// is spent.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "integration/cluster.h"
#include "integration/jobs.h"

namespace lockstep::testing {
namespace {

std::vector<std::string> recoverable_job(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"job.steps=30", "checkpoint.every=5", "job.log_every=5",
                                   "fault.heartbeat_timeout_s=5"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return synthetic_run(dir, 2, sets);
}

TEST(Recovery, KilledWorkerCostsARestartNotTheRun) {
  std::random_device random;
  const int rank = int(random() % 2);
  const int step = 3 + int(random() % 25);
  std::cout << "killing rank " << rank << " at step " << step << std::endl;
  RecordProperty("killed_rank", rank);
  RecordProperty("killed_step", step);

  TempDir whole, broken;
  auto uninterrupted = run_lockstep(recoverable_job(whole), whole.path(), 150);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto expected = read_json(single_run(whole.path() + "/runs") + "/manifest.json");

  auto recovered = run_lockstep(
      recoverable_job(broken, {"fault.max_restarts=2", "test.fail_rank=" + std::to_string(rank),
                               "test.fail_step=" + std::to_string(step), "test.fail_kind=kill"}),
      broken.path(), 170);
  ASSERT_EQ(recovered.exit_code, 0) << recovered.output;
  EXPECT_NE(recovered.output.find("Decision: restart = generation 2 (rank " + std::to_string(rank) +
                                  " ("), std::string::npos) << recovered.output;
  EXPECT_NE(recovered.output.find("was killed by signal 9"), std::string::npos) << recovered.output;
  auto manifest = read_json(single_run(broken.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed");
  EXPECT_EQ(manifest["coordinator"]["generation"], 2) << manifest["coordinator"].dump(2);
  EXPECT_EQ(manifest["metrics"]["final_param_digest"], expected["metrics"]["final_param_digest"]);
  ASSERT_EQ(manifest["restart_count"], 1) << manifest.dump(2);
  const auto& restart = manifest["restarts"][0];
  EXPECT_EQ(restart["dead_rank"], rank);
  EXPECT_EQ(restart["resumed_from_step"], step / 5 * 5);
  // The restart's log line says where the job picked up.
  EXPECT_NE(recovered.output.find("restart to generation 2 resumed from step " + std::to_string(step / 5 * 5) +
                                  " (generation 1 had reached step "),
            std::string::npos) << recovered.output;
  ASSERT_TRUE(restart.contains("recovery_s")) << restart.dump();
  EXPECT_GT(restart["recovery_s"].get<double>(), 0.0);
  // The survivor got through step - 1 (maybe step, if the victim died after its
  // all-reduce); the victim died in step `step`.
  EXPECT_GE(restart["steps_reached"].get<int>(), step - 1) << restart.dump();
  EXPECT_LE(restart["steps_reached"].get<int>(), step) << restart.dump();
  EXPECT_EQ(restart["steps_redone"], restart["steps_reached"].get<int>() - step / 5 * 5);
  // The survivor rejoined from its own process; only the dead rank was replaced.
  const auto& before = manifest["coordinator"]["earlier_generations"][0]["workers"];
  const auto& after = manifest["coordinator"]["workers"];
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(after.size(), 2u);
  auto pid_of = [](const nlohmann::json& workers, int r) {
    for (const auto& w : workers)
      if (w["rank"] == r) return w["pid"].get<int>();
    return -1;
  };
  EXPECT_EQ(pid_of(after, 1 - rank), pid_of(before, 1 - rank)) << manifest["coordinator"].dump(2);
  EXPECT_NE(pid_of(after, rank), pid_of(before, rank));
  for (const auto& w : after)
    EXPECT_EQ(w["back_from_generation"], w["rank"] == rank ? 0 : 1) << w.dump();
  std::cout << "recovery " << restart["recovery_s"].get<double>() << " s, "
            << restart["steps_redone"] << " steps redone" << std::endl;
  // `lockstep status` on the finished run and its report show the real
  // rank, steps redone and recovery time, never -1.
  const std::string folder = single_run(broken.path() + "/runs");
  auto status = run_lockstep({"status", folder}, broken.path(), 30);
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("restart to generation 2: rank " + std::to_string(rank) + " lost; resumed from step " +
                               std::to_string(step / 5 * 5) + ", " + restart["steps_redone"].dump() +
                               " steps redone, recovery "),
            std::string::npos)
      << status.output;
  // No figure printed as -1 (the run id, whose random hex suffix may
  // start with 1, is taken out first: "...-053701-1a9d").
  std::string figures = status.output;
  const std::string run_id = std::filesystem::path(folder).filename().string();
  for (size_t at; (at = figures.find(run_id)) != std::string::npos;) figures.erase(at, run_id.size());
  EXPECT_EQ(figures.find("-1"), std::string::npos) << status.output;
  auto json_status = run_lockstep({"status", folder, "--json"}, broken.path(), 30);
  const auto parsed = nlohmann::json::parse(json_status.output.substr(json_status.output.find('{')));
  EXPECT_EQ(parsed["restarts"][0]["dead_rank"], rank) << parsed.dump(2);
  EXPECT_EQ(parsed["restarts"][0]["steps_redone"], restart["steps_redone"]);
  auto report = run_lockstep({"report", folder}, broken.path(), 60);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  std::ifstream page(folder + "/report.html");
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  const size_t section = html.find("<h2 id=\"restarts\">");
  ASSERT_NE(section, std::string::npos);
  const std::string restarts = html.substr(section, html.find("</table>", section) - section);
  EXPECT_NE(restarts.find("<td>" + std::to_string(rank) + "</td>"), std::string::npos) << restarts;
  EXPECT_EQ(restarts.find("<td>-1</td>"), std::string::npos) << restarts;
  EXPECT_NE(html.find("s of it recovering from 1 restart(s)"), std::string::npos);
  EXPECT_GT(manifest["job_wall_s"].get<double>(), restart["recovery_s"].get<double>());
}

// A standalone `lockstep coordinator`: no launcher of its own. The lost rank
// is noticed by its silence, the test plays the cluster's supervisor
// (systemd Restart=on-failure: a new `lockstep worker` for each one that
// died), and the survivor rejoins from its own process.
TEST(Recovery, StandaloneCoordinatorWaitsForAReplacementFromTheSupervisor) {
  const std::vector<std::string> job = {"job.steps=30", "checkpoint.every=5", "job.log_every=5",
                                        "fault.heartbeat_s=0.5", "fault.heartbeat_timeout_s=3"};
  // The reference is an uninterrupted `lockstep run`: workers started by
  // hand compute the same bits as the launcher's (BLAS threads are set
  // by each rank, not inherited).
  TempDir whole;
  auto uninterrupted = run_lockstep(synthetic_run(whole, 2, job), whole.path(), 150);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto expected = read_json(single_run(whole.path() + "/runs") + "/manifest.json");

  TempDir dir;
  std::vector<std::string> sets = job;
  for (std::string s : {"fault.max_restarts=1", "test.fail_rank=1", "test.fail_step=12",
                        "test.fail_kind=kill"})
    sets.push_back(s);
  Cluster cluster(dir, sets);
  cluster.add_worker();
  cluster.add_worker();
  // The supervisor: every worker that ends unsuccessfully gets a replacement.
  std::set<pid_t> replaced;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (cluster.coordinator->running() && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < cluster.workers.size(); ++i) {
      auto& worker = *cluster.workers[i];
      if (worker.running() || worker.wait(0) == 0 || replaced.count(worker.pid())) continue;
      std::cout << "supervisor: worker pid " << worker.pid() << " ended with " << worker.wait(0)
                << "; starting a replacement" << std::endl;
      replaced.insert(worker.pid());
      cluster.add_worker();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(cluster.coordinator->wait(30), 0) << cluster.coordinator->output();
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_NE(cluster.coordinator->output().find("Decision: restart = generation 2 (rank 1 ("),
            std::string::npos) << cluster.coordinator->output();
  EXPECT_NE(cluster.coordinator->output().find("declared dead"), std::string::npos);
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed") << manifest.dump(2);
  EXPECT_EQ(manifest["restart_count"], 1);
  EXPECT_EQ(manifest["restarts"][0]["dead_rank"], 1);
  EXPECT_EQ(manifest["restarts"][0]["resumed_from_step"], 10);
  EXPECT_EQ(manifest["coordinator"]["generation"], 2);
  EXPECT_EQ(manifest["metrics"]["final_param_digest"], expected["metrics"]["final_param_digest"]);
  auto& survivor = replaced.count(cluster.workers[0]->pid()) ? *cluster.workers[1]
                                                             : *cluster.workers[0];
  EXPECT_EQ(survivor.wait(10), 0);
  EXPECT_NE(survivor.output().find("the same process as in generation 1"), std::string::npos)
      << survivor.output();
}

TEST(Recovery, ASecondFailureWithOneRestartAllowedEndsTheJob) {
  TempDir dir;
  auto result = run_lockstep(
      recoverable_job(dir, {"fault.max_restarts=1", "test.fail_rank=1", "test.fail_step=7",
                            "test.fail_kind=exit", "test.fail_generations=2"}),
      dir.path(), 170);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("Decision: restart = generation 2"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("Decision: restart = generation 3"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("the restart budget is spent (fault.max_restarts = 1)"),
            std::string::npos) << result.output;
  auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["restart_count"], 1);
  EXPECT_NE(manifest["final_failure"].get<std::string>().find("rank 1"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::testing
