// Models written in Python: TorchScript modules made by Debian's
// python3-torch (tests/python/scripted_fixtures.py), trained by real
// lockstep processes over real Gloo, checked against PyTorch itself.
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "integration/cluster.h"
#include "integration/jobs.h"
#include "runtime/model/models.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;

// The fixtures (models and array folders) in `dir`/fx.
std::string make_fixtures(const TempDir& dir) {
  const std::string out = dir.path() + "/fx";
  auto made = python_tool("scripted_fixtures.py", "make " + out + " 2>&1");
  EXPECT_EQ(made.exit_code, 0) << made.output;
  return out;
}

nlohmann::json python_json(const std::string& args) {
  auto result = python_tool("scripted_fixtures.py", args + " 2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const auto start = result.output.rfind("\n{");
  return nlohmann::json::parse(result.output.substr(start == std::string::npos ? 0 : start + 1));
}

// `lockstep run` on a scripted model and an array folder of the fixtures.
std::vector<std::string> scripted_run(const TempDir& dir, const std::string& runs, int nproc,
                                      const std::string& fx, const std::string& model,
                                      const std::string& data, std::vector<std::string> sets) {
  std::vector<std::string> all = {"model.name=torchscript", "model.path=" + fx + "/" + model,
                                  "data.name=arrays", "data.train=" + fx + "/" + data + "/train",
                                  "data.test=" + fx + "/" + data + "/test", "job.seed=5",
                                  "data.batch_size=16", "job.run_dir=" + runs};
  all.insert(all.end(), sets.begin(), sets.end());
  std::vector<std::string> args = {"run", examples_dir() + "/synthetic.toml", "--nproc", std::to_string(nproc)};
  for (auto& s : all) {
    args.push_back("--set");
    args.push_back(s);
  }
  (void)dir;
  return args;
}

std::string trained(const TempDir& dir, const std::string& name, int nproc, const std::string& fx,
                    const std::string& model, const std::string& data,
                    const std::vector<std::string>& sets) {
  const std::string runs = dir.path() + "/" + name;
  auto result = run_lockstep(scripted_run(dir, runs, nproc, fx, model, data, sets), dir.path(), 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return single_run(runs);
}

std::map<std::string, at::Tensor> file_parameters(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  torch::jit::Module module = torch::jit::load(path);
  for (const auto& item : module.named_parameters()) out[item.name] = item.value.detach().clone();
  return out;
}

double max_abs_difference(const std::map<std::string, at::Tensor>& a,
                          const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    if (!b.count(name)) {
      ADD_FAILURE() << name << " missing";
      continue;
    }
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

bool has_decision(const nlohmann::json& manifest, const std::string& what) {
  for (const auto& d : manifest["decisions"])
    if (d.value("what", "") == what) return true;
  return false;
}

TEST(ScriptedModel, TrainsLikePyTorchEagerWithATiedWeightAndAFrozenLayer) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  struct Case {
    std::string optim, lr;
    std::vector<std::string> sets;
  };
  for (const Case& c : {Case{"sgd", "0.1", {"optim.momentum=0.9"}},
                        Case{"adamw", "0.01", {"optim.weight_decay=0.01"}}}) {
    std::vector<std::string> sets = {"optim.name=" + c.optim, "optim.lr=" + c.lr, "job.steps=10"};
    sets.insert(sets.end(), c.sets.begin(), c.sets.end());
    const std::string run = trained(dir, "runs-" + c.optim, 1, fx, "tied.pt", "classes", sets);
    auto compared = python_json("eager " + fx + " " + fx + "/classes cross_entropy " + c.optim + " " +
                                c.lr + " 10 16 5 " + run + "/model-final.pt");
    std::printf("%s: max |lockstep - PyTorch eager| = %.3g (parameters moved up to %.3g)\n",
                c.optim.c_str(), compared["max_abs_diff"].get<double>(),
                compared["max_moved"].get<double>());
    EXPECT_LE(compared["max_abs_diff"].get<double>(), 1e-5) << c.optim;
    EXPECT_GT(compared["max_moved"].get<double>(), 1e-3) << "training moved nothing";
    EXPECT_TRUE(compared["tied_in_file"].get<bool>()) << "model-final.pt lost the tie";
    EXPECT_TRUE(compared["frozen_unchanged"].get<bool>()) << "a frozen parameter was updated";
    auto manifest = read_json(run + "/manifest.json");
    EXPECT_TRUE(has_decision(manifest, "tied_parameter")) << manifest["decisions"].dump();
    EXPECT_TRUE(has_decision(manifest, "frozen_parameters")) << manifest["decisions"].dump();
  }
}

TEST(ScriptedModel, ItsOwnLossMethodIsUsedWithMissingTargetsLeftOut) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::string run = trained(dir, "runs", 1, fx, "tied.pt", "values",
                                  {"loss.name=model", "optim.lr=0.1", "job.steps=10"});
  auto compared = python_json("eager " + fx + " " + fx + "/values model sgd 0.1 10 16 5 " + run +
                              "/model-final.pt");
  std::printf("loss.name = model: max |lockstep - PyTorch eager| = %.3g\n",
              compared["max_abs_diff"].get<double>());
  EXPECT_LE(compared["max_abs_diff"].get<double>(), 1e-5);
  auto metrics = read_json(run + "/manifest.json")["metrics"];
  EXPECT_GT(metrics["masked_targets"].get<int64_t>(), 0) << "the data has NaN targets";
  auto scored = python_json("score " + run + "/model-final.pt " + fx + "/values model");
  EXPECT_NEAR(metrics["test_loss"].get<double>(), scored["loss"].get<double>(), 1e-4);
}

// 2 ranks x B = 1 x 2B = accumulation of 2 x B, after one step, per loss.
TEST(ScriptedModel, TwoRanksOfBatchBEqualOneOfBatch2BUnderEveryLoss) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::vector<std::pair<std::string, std::string>> losses = {
      {"cross_entropy", "classes"}, {"mse", "values"}, {"l1", "values"},
      {"bce_with_logits", "labels"}, {"model", "values"}};
  for (const auto& [loss, data] : losses) {
    auto run = [&](const std::string& name, int nproc, int batch, int accum) {
      return file_parameters(
          trained(dir, loss + "-" + name, nproc, fx, "tied.pt", data,
                  {"loss.name=" + loss, "optim.lr=0.1", "job.steps=1", "eval.every=0",
                   "data.batch_size=" + std::to_string(batch),
                   "train.accum_steps=" + std::to_string(accum)}) + "/model-final.pt");
    };
    auto ranks = run("ranks", 2, 8, 1), single = run("single", 1, 16, 1),
         accumulated = run("accum", 1, 8, 2);
    const double d_ranks = max_abs_difference(ranks, single),
                 d_accum = max_abs_difference(accumulated, single);
    std::printf("%s: |2 x 8 - 1 x 16| = %.3g, |accum 2 x 8 - 1 x 16| = %.3g\n", loss.c_str(),
                d_ranks, d_accum);
    EXPECT_LE(d_ranks, 1e-6) << loss;
    EXPECT_LE(d_accum, 1e-6) << loss;
  }
}

TEST(ScriptedModel, BatchNormBuffersFollowTheCommBuffersPolicyAndTheSavedModelScoresAsReported) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  std::map<std::string, std::string> rank0_digest;
  for (const std::string policy : {"broadcast", "average", "local"}) {
    const std::string run = trained(dir, policy, 2, fx, "bn.pt", "images",
                                    {"comm.buffers=" + policy, "optim.lr=0.05", "job.steps=30",
                                     "audit.every=10", "audit.buffers=check"});
    std::vector<std::string> digests;
    for (int rank : {0, 1})
      for (const auto& e : read_json_lines(run + "/events-rank" + std::to_string(rank) + ".jsonl"))
        if (e["event"] == "end") digests.push_back(e["metrics"]["final_buffer_digest"]);
    ASSERT_EQ(digests.size(), 2u);
    rank0_digest[policy] = digests[0];
    if (policy == "local")
      EXPECT_NE(digests[0], digests[1]) << "local: each rank's own running statistics";
    else
      EXPECT_EQ(digests[0], digests[1]) << policy << ": the ranks' buffers must be equal";
    auto manifest = read_json(run + "/manifest.json");
    EXPECT_EQ(manifest["metrics"]["audits_disagreeing"], 0) << policy << ": false alarms";
    EXPECT_GT(manifest["metrics"]["audits"].get<int64_t>(), 0);
    EXPECT_EQ(has_decision(manifest, "audit_buffers"), policy == "local") << policy;
    auto scored = python_json("score " + run + "/model-final.pt " + fx + "/images cross_entropy");
    const double reported = manifest["metrics"]["test_accuracy"];
    std::printf("%s: lockstep reported accuracy %.4f, model-final.pt in Python scores %.4f\n",
                policy.c_str(), reported, scored["accuracy"].get<double>());
    EXPECT_NEAR(reported, scored["accuracy"].get<double>(), 5e-4) << policy;
    EXPECT_NEAR(manifest["metrics"]["test_loss"].get<double>(), scored["loss"].get<double>(), 5e-4);
  }
  EXPECT_NE(rank0_digest["broadcast"], rank0_digest["average"]) << "averaging changed nothing";
}

TEST(ScriptedModel, ACheckpointedRunResumesBitForBit) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::vector<std::string> common = {"optim.lr=0.05", "checkpoint.every=10", "eval.every=0"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), common.begin(), common.end());
    return sets;
  };
  const std::string straight = trained(dir, "straight", 2, fx, "bn.pt", "images", with({"job.steps=30"}));
  const std::string first = trained(dir, "first", 2, fx, "bn.pt", "images", with({"job.steps=20"}));
  auto resumed = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--resume", first, "--set",
                               "job.steps=30"}, dir.path(), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string digest = read_json(straight + "/manifest.json")["metrics"]["final_param_digest"];
  EXPECT_EQ(read_json(first + "/manifest.json")["metrics"]["final_param_digest"], digest)
      << "parameters and BatchNorm buffers after a resume differ from the uninterrupted run";
  EXPECT_EQ(max_abs_difference(file_parameters(first + "/model-final.pt"),
                               file_parameters(straight + "/model-final.pt")), 0.0);
}

// The same file from a hand-started coordinator and its workers: status
// shows the evaluation's metrics for the loss (MSE and MAE for mse).
TEST(ScriptedModel, TrainsUnderACoordinatorAndStatusShowsTheMetricsOfItsLoss) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  Cluster cluster(dir, {"model.name=torchscript", "model.path=" + fx + "/tied.pt", "data.name=arrays",
                        "data.train=" + fx + "/values/train", "data.test=" + fx + "/values/test",
                        "loss.name=mse", "optim.lr=0.02", "data.batch_size=16", "job.steps=4000",
                        "eval.every=20", "fault.heartbeat_s=0.1", "fault.heartbeat_timeout_s=5"});
  cluster.add_worker();
  cluster.add_worker();
  // Both views while the job runs (it trains 4,000 steps; the first
  // evaluation comes at step 20): the reply's field and the table a person reads.
  std::string last_eval, table;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         (last_eval.empty() || table.find("last eval: step") == std::string::npos)) {
    v1::StatusReply reply;
    if (cluster.client().status(&reply, std::chrono::seconds(5)).ok()) last_eval = reply.last_eval();
    table = run_lockstep({"status", "--coordinator", cluster.address()}, dir.path(), 15,
                         {"LOCKSTEP_TOKEN=" + kToken}).output;
  }
  EXPECT_NE(last_eval.find("(mse)"), std::string::npos) << last_eval;
  EXPECT_NE(last_eval.find("mae"), std::string::npos) << last_eval;
  EXPECT_NE(table.find("last eval: step"), std::string::npos) << table;
  for (auto& worker : cluster.workers) EXPECT_EQ(worker->wait(120), 0) << worker->output();
  EXPECT_EQ(cluster.coordinator->wait(30), 0) << cluster.coordinator->output();
  auto metrics = read_json(single_run(dir.path() + "/runs") + "/manifest.json")["metrics"];
  EXPECT_TRUE(metrics["test_metrics"].contains("mse")) << metrics.dump();
  EXPECT_TRUE(metrics["test_metrics"].contains("mae")) << metrics.dump();
  EXPECT_FALSE(metrics["test_metrics"].contains("accuracy")) << metrics.dump();
}

TEST(ScriptedModel, AnAllMissingBatchChangesNothing) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::string runs = dir.path() + "/runs";
  auto result = run_lockstep(scripted_run(dir, runs, 2, fx, "tied.pt", "missing",
                                          {"loss.name=mse", "optim.lr=0.1", "job.steps=3", "eval.every=0"}),
                             dir.path(), 120);
  EXPECT_EQ(result.exit_code, 1) << "a run in which no step trained is not a success\n" << result.output;
  EXPECT_NE(result.output.find("no step trained"), std::string::npos) << result.output;
  const std::string run = single_run(runs);
  EXPECT_EQ(max_abs_difference(file_parameters(run + "/model-final.pt"),
                               file_parameters(fx + "/tied.pt")), 0.0);
  EXPECT_EQ(read_json(run + "/manifest.json")["metrics"]["skipped_steps"], 3);
}

TEST(ScriptedModel, DictOutputPickedByModelOutputAndBf16AutocastTrainsIt) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::string run = trained(dir, "runs", 2, fx, "dict.pt", "classes",
                                  {"model.output=logits", "job.steps=5", "precision=bf16",
                                   "precision.allow_emulated=true"});
  auto manifest = read_json(run + "/manifest.json");
  EXPECT_TRUE(has_decision(manifest, "model_output")) << manifest["decisions"].dump();
}

// CPU autocast acts in the dispatcher, below TorchScript's interpreter: a
// scripted Linear whose weight bf16 cannot hold computes in bf16 under it.
TEST(ScriptedModel, Bf16AutocastReachesTheOperatorsOfAScriptedModule) {
  TempDir dir;
  const std::string path = dir.path() + "/linear.pt";
  auto made = shell_output(LOCKSTEP_PYTHON " -c \"import torch; m = torch.nn.Linear(1, 1); "
                    "m.weight.data.fill_(1 + 2 ** -10); m.bias.data.zero_(); "
                    "torch.jit.script(m).save('" + path + "')\" 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ModelSection section;
  section.name = "torchscript";
  section.path = path;
  auto model = ModelRegistry::with_builtins().build(section);
  const at::Tensor one = torch::ones({1, 1});
  EXPECT_DOUBLE_EQ(forward_output(*model, one, at::kFloat).item<double>(), 1.0 + std::ldexp(1.0, -10));
  at::Tensor under_bf16 = forward_output(*model, one, at::kBFloat16);
  EXPECT_EQ(under_bf16.scalar_type(), at::kFloat);
  EXPECT_DOUBLE_EQ(under_bf16.item<double>(), 1.0) << "autocast did not reach the scripted Linear";
}

// Bad input: one error line naming the problem, exit 2, no run folder.
void expect_refused(const TempDir& dir, const std::string& fx, const std::string& model,
                    const std::string& data, const std::vector<std::string>& sets,
                    const std::string& needle) {
  const std::string runs = dir.path() + "/refused";
  auto result = run_lockstep(scripted_run(dir, runs, 2, fx, model, data, sets), dir.path(), 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  int error_lines = 0;
  bool named = false;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("error") == std::string::npos) continue;
    ++error_lines;
    named |= line.find(needle) != std::string::npos;
  }
  EXPECT_TRUE(named) << "no error line naming '" << needle << "' in:\n" << result.output;
  EXPECT_EQ(error_lines, 1) << result.output;
  EXPECT_FALSE(fs::exists(runs)) << "a run folder was created";
}

TEST(ScriptedModel, BadModelsAreRefusedBeforeAnythingStarts) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  expect_refused(dir, fx, "frozen.pt", "classes", {}, "no trainable parameter");
  expect_refused(dir, fx, "not_a_module.pt", "classes", {}, "is not a TorchScript module");
  // A module scripted by a newer PyTorch: the operator this LibTorch lacks is named, and why.
  expect_refused(dir, fx, "newer_op.pt", "classes", {},
                 "calls the operator aten::tanh_from_a_newer_pytorch, which this lockstep's LibTorch");
  expect_refused(dir, fx, "absent.pt", "classes", {}, "absent.pt: no such file");
  expect_refused(dir, fx, "tied.pt", "wide", {}, "input of shape [16, 10]");
  expect_refused(dir, fx, "dict.pt", "classes", {}, "set model.output to the key");
  expect_refused(dir, fx, "dict.pt", "classes", {"model.output=scores"},
                 "model.output = scores is not a key of the dict");
  expect_refused(dir, fx, "tied.pt", "classes", {"precision.fp32_modules=head"},
                 "precision.fp32_modules = head cannot be honoured");
  expect_refused(dir, fx, "tied.pt", "classes", {"precision.check_overflow=true"},
                 "precision.check_overflow = true cannot be honoured");
  expect_refused(dir, fx, "dict.pt", "classes", {"model.output=logits", "loss.name=model"},
                 "needs a loss(output, target) method");
  expect_refused(dir, fx, "tied.pt", "values", {}, "loss.name = cross_entropy needs");
  expect_refused(dir, fx, "nan_weight.pt", "classes", {},
                 "parameter 'middle.weight' [16, 16] holds 1 non-finite value(s) (NaN or Inf) before training");
  expect_refused(dir, fx, "inf_buffer.pt", "images", {},
                 "buffer 'bn.running_var' [8] holds 8 non-finite value(s)");
}

TEST(ScriptedModel, AnAllZeroWeightMatrixIsWarnedAbout) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  auto result = run_lockstep(scripted_run(dir, dir.path() + "/runs", 2, fx, "zero_weight.pt", "classes",
                                          {"job.steps=2"}),
                             dir.path(), 120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("weight 'encode.weight' [16, 8] is entirely zero before training"), std::string::npos)
      << result.output;
}

// A model whose evaluation forward fails only under bf16 autocast (as
// LibTorch 1.13's fused TransformerEncoder eval path did) evaluates in fp32,
// said once, and trains to the end; a TransformerEncoder trains and
// evaluates in bf16 beside it.
TEST(ScriptedModel, AModelWhoseEvaluationFailsInBf16EvaluatesInFp32AndTrainsToTheEnd) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  std::vector<std::string> bf16 = {"job.steps=20", "eval.every=5", "precision.allow_emulated=true",
                                   "precision=bf16"};
  auto count_evals = [](const std::string& runs) {
    int evals = 0;
    for (const auto& e : read_json_lines(single_run(runs) + "/events-rank0.jsonl"))
      evals += e.value("event", "") == "eval";
    return evals;
  };
  auto result = run_lockstep(scripted_run(dir, dir.path() + "/bf16", 2, fx, "bf16_eval_fails.pt", "classes", bf16),
                             dir.path(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Decision: eval_precision = fp32 (the dry run's evaluation forward fails under bf16"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(read_json(single_run(dir.path() + "/bf16") + "/manifest.json")["status"], "completed");
  EXPECT_EQ(count_evals(dir.path() + "/bf16"), 4) << "evaluations at steps 5, 10, 15 and the end";

  auto transformer = run_lockstep(
      scripted_run(dir, dir.path() + "/transformer", 2, fx, "transformer.pt", "classes", bf16), dir.path(), 120);
  ASSERT_EQ(transformer.exit_code, 0) << transformer.output;
  EXPECT_EQ(read_json(single_run(dir.path() + "/transformer") + "/manifest.json")["status"], "completed");
  EXPECT_EQ(count_evals(dir.path() + "/transformer"), 4);
}

TEST(ScriptedModel, ATrainingStepThatFailsInBf16IsRefusedBeforeStartNamingThePhaseAndPrecision) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::string runs = dir.path() + "/runs";
  auto result = run_lockstep(scripted_run(dir, runs, 2, fx, "bf16_train_fails.pt", "classes",
                                          {"precision=bf16", "precision.allow_emulated=true"}),
                             dir.path(), 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_LT(result.seconds, 30.0);
  EXPECT_NE(result.output.find("the dry run of one training step (forward and backward, precision bf16)"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("set precision = fp32"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(runs)) << "refused before anything started";
}

TEST(ScriptedModel, AModelThatRaisesInEvaluationOnFourRanksIsReportedOnce) {
  TempDir dir;
  const std::string fx = make_fixtures(dir);
  const std::string runs = dir.path() + "/runs";
  auto result = run_lockstep(scripted_run(dir, runs, 4, fx, "fails_in_eval.pt", "classes",
                                          {"job.steps=20", "eval.every=5", "fault.max_restarts=2"}),
                             dir.path(), 120);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  size_t lines = 0, tracebacks = 0;
  std::istringstream output(result.output);
  for (std::string line; std::getline(output, line);) {
    ++lines;
    tracebacks += line.find("Traceback of TorchScript, original code") != std::string::npos;
  }
  // About 40 start-up decisions and 4 ranks' lines: a message repeated per rank would be hundreds.
  EXPECT_LT(lines, 85u) << result.output;
  EXPECT_EQ(tracebacks, 1u) << "the whole message once, for the job\n" << result.output;
  EXPECT_NE(result.output.find("evaluation at step 5 (precision fp32) failed in"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("the evaluation head is not ready for this input"), std::string::npos);
  EXPECT_NE(result.output.find("failed: the same as rank"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("Decision: restart"), std::string::npos) << "a model's own error is not retried";
  const std::string run = single_run(runs);
  const auto manifest = read_json(run + "/manifest.json");
  EXPECT_EQ(manifest["status"], "failed");
  EXPECT_NE(manifest.value("error", "").find("evaluation at step 5"), std::string::npos) << manifest.dump(2);
  std::ifstream detail(run + "/failure-rank0.log");
  const std::string whole((std::istreambuf_iterator<char>(detail)), std::istreambuf_iterator<char>());
  EXPECT_NE(whole.find("Traceback of TorchScript"), std::string::npos) << whole;
}

// The test accuracy a run reported and that of its model-final.pt scored
// again in PyTorch (tests/python/score_run.py) on all 10,000 test images;
// NaN where either is missing (the failure is recorded).
struct ScoredRun {
  double reported = std::nan("");
  double in_pytorch = std::nan("");
};

ScoredRun scored_in_pytorch(const std::string& runs) {
  ScoredRun scored;
  const std::string run = single_run(runs);
  scored.reported = read_json(run + "/manifest.json")["metrics"]["test_accuracy"];
  const auto result = python_tool("score_run.py", run + " 2>&1", 300);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  if (result.exit_code != 0) return scored;
  const auto python = nlohmann::json::parse(result.output.substr(result.output.rfind('{')));
  EXPECT_EQ(python["samples"], 10000) << result.output;
  scored.in_pytorch = python["accuracy"].get<double>();
  return scored;
}

TEST(ScriptedModel, TheBuiltInCnnsModelFinalLoadsInPyTorchAndScoresAsReported) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string runs = dir.path() + "/" + precision;
    auto result = run_lockstep({"run", examples_dir() + "/fashion_mnist_cnn.toml", "--nproc", "2", "--set",
                                "job.run_dir=" + runs, "--set", "job.steps=30", "--set", "eval.every=0", "--set",
                                std::string("precision=") + precision, "--set", "precision.allow_emulated=true"},
                               dir.path(), 180);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const ScoredRun scored = scored_in_pytorch(runs);
    EXPECT_NEAR(scored.in_pytorch, scored.reported, 1e-6) << precision;
    std::printf("cnn, 30 steps, %s: lockstep %.4f, model-final.pt in PyTorch %.4f\n", precision, scored.reported,
                scored.in_pytorch);
  }
}

// What a lab writes in PyTorch, scripted by the PyTorch lockstep links
// (tests/python/pytorch_models.py in .venv): torchvision's resnet18 and an
// nn.TransformerEncoder (whose 2.x attention, aten::scaled_dot_product_attention,
// LibTorch 1.13 did not have) train on 2 ranks, and model-final.pt scored
// again in that PyTorch gives lockstep's accuracy.
TEST(ScriptedModel, Resnet18AndATransformerScriptedByThisPyTorchTrainAndScoreBackAsReported) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir dir;
  const auto made = python_tool("pytorch_models.py", dir.path() + "/models 2>&1", 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto versions = nlohmann::json::parse(made.output.substr(made.output.rfind('{')));
  for (const char* model : {"resnet18", "transformer"}) {
    const std::string runs = dir.path() + "/" + model;
    auto result = run_lockstep({"run", examples_dir() + "/resnet18/job.toml", "--set", "job.run_dir=" + runs,
                                "--set", "model.path=" + dir.path() + "/models/" + model + ".pt", "--set",
                                "job.steps=30", "--set", "optim.warmup_steps=5", "--set", "precision=fp32"},
                               dir.path(), 240);
    ASSERT_EQ(result.exit_code, 0) << model << ": " << result.output;
    const ScoredRun scored = scored_in_pytorch(runs);
    EXPECT_NEAR(scored.in_pytorch, scored.reported, 1e-6) << model;
    EXPECT_GT(scored.reported, 0.3) << model << " after 30 steps (chance: 0.1)";
    std::printf("%s scripted by PyTorch %s, 30 steps on 2 ranks: lockstep %.4f, model-final.pt in PyTorch %.4f\n",
                model, versions["torch"].get<std::string>().c_str(), scored.reported, scored.in_pytorch);
  }
}

}  // namespace
}  // namespace lockstep::testing
