#pragma once
// Evaluation on the test set, the same figures on every rank and at every
// world size: the test set is cut into chunks of the evaluation batch in
// order, each seen exactly once (rank r of W takes a contiguous block), the
// objective's sums per chunk are summed exactly over all chunks
// (exact_sum.h), and the metrics come from the totals.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/data/dataset.h"

namespace lockstep {

struct EvalResult {
  double loss = 0.0;      // mean over every valid target of the test set
  double accuracy = 0.0;  // cross_entropy; 0 for the other losses
  int64_t samples = 0;    // test samples seen (each exactly once)
  nlohmann::json metrics = nlohmann::json::object();  // what fits the loss (objective.h)
};

class Model;
class Objective;
class CollectiveGroup;
// Evaluates on the test set: rank r takes chunks [rC/W, (r+1)C/W); sums are
// summed exactly on `group`, so every rank returns the same figures. The
// forward runs at `precision` (fp32 | bf16). What the model raises is a
// ModelFailure that begins with `where` ("evaluation at step 20").
EvalResult evaluate(Model& model, const Objective& objective, const Dataset& test, int rank,
                    int world_size, int64_t batch_size, CollectiveGroup& group,
                    const std::string& precision = "fp32", const std::string& where = "evaluation");

// "test loss 0.41 [0.39, 0.43] (cross_entropy), accuracy 0.8500 [0.8429, 0.8568], ...
// (n = 10000, 95% intervals)": for the log.
std::string describe_metrics(const Objective& objective, const EvalResult& eval);

// When `metric` (the objective's headline: accuracy, mse, ...) moved less
// between two evaluations of one set than the half-width of its 95%
// interval now, that change cannot be told from sampling noise: returns the
// sentence that says so, else "". Empty too where no interval is known.
std::string change_within_noise(const std::string& metric, int64_t before_step, const EvalResult& before,
                                int64_t step, const EvalResult& now);

}  // namespace lockstep
