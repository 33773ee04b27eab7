// Principle 7: the gradient is the mean over the global batch. Two ranks
// with batch B must train the model one process trains with batch 2B on the
// same samples; accumulation over 2 microbatches must equal one batch of
// twice the size. Real processes, real Gloo; parameters read back from the
// run folders.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "integration/jobs.h"
#include "runtime/model/models.h"

namespace lockstep::testing {
namespace {

std::vector<at::Tensor> trained_parameters(const TempDir& dir, int nproc,
                                           const std::vector<std::string>& sets) {
  auto result = run_lockstep(synthetic_run(dir, nproc, sets), dir.path(), 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  ModelSection section;
  section.name = "mlp";
  auto model = ModelRegistry::with_builtins().build(section);
  auto module = std::static_pointer_cast<torch::nn::Module>(native_module(model));
  torch::load(module, single_run(dir.path() + "/runs") + "/model-final.pt");
  return module->parameters();
}

double max_abs_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

std::vector<std::string> sgd(int steps, int batch, int accum = 1) {
  return {"model.name=mlp", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05",
          "job.steps=" + std::to_string(steps), "data.batch_size=" + std::to_string(batch),
          "train.accum_steps=" + std::to_string(accum), "eval.every=0"};
}

TEST(GradientEquivalence, TwoRanksOfBatchBEqualOneProcessOfBatch2B) {
  for (int steps : {1, 20}) {
    TempDir two, one;
    auto ranks = trained_parameters(two, 2, sgd(steps, 16));
    auto single = trained_parameters(one, 1, sgd(steps, 32));
    double diff = max_abs_difference(ranks, single);
    std::printf("steps %d: max |2 ranks x 16 - 1 x 32| = %.3g\n", steps, diff);
    EXPECT_LE(diff, steps == 1 ? 1e-6 : 1e-4) << "after " << steps << " steps";
  }
}

TEST(GradientEquivalence, AccumulationOfTwoMicrobatchesEqualsOneBatchOfTwiceTheSize) {
  for (int steps : {1, 20}) {
    TempDir accumulated, whole, ranks_accumulated;
    auto a = trained_parameters(accumulated, 1, sgd(steps, 16, 2));
    auto w = trained_parameters(whole, 1, sgd(steps, 32));
    auto r = trained_parameters(ranks_accumulated, 2, sgd(steps, 8, 2));
    double diff = max_abs_difference(a, w), diff_ranks = max_abs_difference(r, w);
    std::printf("steps %d: accum 2x16 vs 32: %.3g; 2 ranks x accum 2x8 vs 32: %.3g\n", steps,
                diff, diff_ranks);
    EXPECT_LE(diff, steps == 1 ? 1e-6 : 1e-4);
    EXPECT_LE(diff_ranks, steps == 1 ? 1e-6 : 1e-4);
  }
}

// The comparison can fail: a different global batch gives a different model.
TEST(GradientEquivalence, ADifferentGlobalBatchIsDetected) {
  TempDir two, one;
  auto ranks = trained_parameters(two, 2, sgd(1, 16));
  auto single = trained_parameters(one, 1, sgd(1, 16));  // half the global batch
  EXPECT_GT(max_abs_difference(ranks, single), 1e-5);
}

}  // namespace
}  // namespace lockstep::testing
