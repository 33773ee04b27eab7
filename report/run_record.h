#pragma once
// What one run folder says about its run, gathered for a report: the
// manifest's outcome, settings and restarts, each rank's step, evaluation,
// audit and decision events, the coordinator's audit findings. Reads a
// finished, failed, interrupted or still running run; a torn last line or
// a missing file is noted in `problems`, never fatal. Not a run folder
// (no manifest and no events): InputError naming the folder.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lockstep::report {

struct Point {
  double step = 0;
  double value = 0;
};

// One rank's step event: the figures a per-step CSV row holds.
struct StepRow {
  int rank = 0;
  int generation = 1;  // counts the rank's `resumed` events
  int64_t step = 0;
  double time = 0;  // Unix seconds
  double loss = 0, lr = 0, samples_per_s = 0;
  std::map<std::string, double> phases;  // running totals, seconds
};

struct EvalRow {
  int rank = 0;
  int64_t step = 0;
  std::string split;
  std::map<std::string, double> metrics;  // loss, accuracy, ...
};

struct AuditMark {
  int64_t step = 0;
  bool agreed = true;
  double max_abs_diff = 0;
  std::string verdict;  // the finding in words ("DRIFT: fc2.bias ranks {0} vs {1} ...")
};

struct RestartMark {
  int generation = 0;
  int dead_rank = -1;
  int64_t resumed_from_step = 0, steps_reached = 0, steps_redone = 0;
  double recovery_s = -1;  // death to the first step of the new generation; -1 unknown
  std::string reason;
};

// An elastic job's generation after the first: its world size and why.
struct MembershipMark {
  int generation = 0;
  int64_t step = -1;  // where it went on from
  int world_size_before = 0, world_size = 0;
  std::string kind, reason;  // kind: loss | regroup
  double seconds = -1;       // from the end of the last generation to this one's first step; -1 unknown
};

// One decision and the ranks that made it with this value and reason.
struct DecisionRow {
  std::string what, value, reason;
  std::vector<int> ranks;
};

struct RunRecord {
  std::string folder, run_id, status;  // status as the manifest has it ("" when it is missing)
  std::string ending;                  // why it ended, in words (error, failure, drift)
  std::string started_at, finished_at;
  int world_size = 0;
  int64_t total_steps = 0;  // job.steps, or the steps epochs make (0 unknown)
  int64_t last_step = 0;    // the furthest step any rank's events reached
  double wall_s = 0;        // from the manifest's phases, else the events' first and last times
  double job_wall_s = -1;   // the whole job as the coordinator saw it (-1: not recorded)
  std::map<std::string, std::string> settings;  // "optim.lr" -> "0.05"
  std::map<std::string, std::string> sources;   // "optim.lr" -> "--set"
  std::vector<StepRow> steps;                   // every rank, in file order
  std::vector<EvalRow> evals;                   // every rank's evaluations
  std::vector<AuditMark> audits;                // rank 0's verdicts, one per audited step
  int64_t first_drift_step = -1;
  std::string first_drift;  // what parted first, in words
  std::vector<RestartMark> restarts;
  std::vector<MembershipMark> membership;  // the world size over time (elastic jobs)
  std::vector<DecisionRow> decisions;
  std::map<int, std::map<std::string, double>> phases_by_rank;  // the latest totals of each rank
  std::map<std::string, double> final_metrics;                  // test_accuracy, test_loss, ...
  std::vector<std::string> problems;  // what could not be read, each naming its file
};

RunRecord load_run(const std::string& folder);

}  // namespace lockstep::report
