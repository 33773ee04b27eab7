// The shipped Kubernetes manifests (deploy/k8s/*.yaml), read with
// python3-yaml and run as a kubelet and the Job controller would run them:
// each pod a namespace host (support/net_hosts.h) with the pod's host name,
// its Service names in /etc/hosts, its volumes bound at their mount paths,
// and the environment a kubelet gives (the container's env with field and
// Secret references resolved, $(VAR) expanded in the command,
// JOB_COMPLETION_INDEX, HOSTNAME, the Services' variables). A failed worker
// pod is replaced as the worker Job's restartPolicy, podFailurePolicy and
// backoffLimit say.
//
// Not emulated: CPU and memory limits (no cgroup per pod), the Service's
// cluster IP (its name resolves to the pod's own address, so the test
// insists that every Service port equals its target port), the image (the
// container's `lockstep` is the binary this build made).
#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "support/cli_runner.h"
#include "support/net_hosts.h"

namespace lockstep::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kToken = "kubernetes-token-0123456789abcdef";
const std::string kIndexAnnotation = "metadata.annotations['batch.kubernetes.io/job-completion-index']";

std::string manifests_dir() { return std::string(LOCKSTEP_SOURCE_DIR) + "/deploy/k8s"; }

// "" when python3 with yaml is here, else the reason.
std::string no_yaml() {
  return shell(LOCKSTEP_PYTHON " -c 'import yaml' 2>/dev/null") == 0
             ? ""
             : "python3-yaml is missing: bash deploy/install-deps.sh";
}

// Every object in deploy/k8s/*.yaml, in file order.
std::vector<json> load_manifests(const std::string& scratch) {
  const std::string script = scratch + "/read_manifests.py";
  std::ofstream(script) << "import glob, json, sys, yaml\n"
                           "docs = []\n"
                           "for name in sorted(glob.glob(sys.argv[1] + '/*.yaml')):\n"
                           "    with open(name) as f:\n"
                           "        docs += [d for d in yaml.safe_load_all(f) if d]\n"
                           "with open(sys.argv[2], 'w') as out:\n"
                           "    json.dump(docs, out)\n";
  const std::string out = scratch + "/manifests.json";
  if (shell(LOCKSTEP_PYTHON " " + script + " " + manifests_dir() + " " + out) != 0)
    throw std::runtime_error("python3 could not read the manifests in " + manifests_dir());
  return read_json(out).get<std::vector<json>>();
}

const json& object(const std::vector<json>& objects, const std::string& kind, const std::string& name) {
  for (const auto& o : objects)
    if (o.value("kind", "") == kind && o["metadata"].value("name", "") == name) return o;
  throw std::runtime_error("deploy/k8s has no " + kind + " named " + name);
}

// The Jobs: the coordinator's (not Indexed) and the workers' (Indexed).
const json& job(const std::vector<json>& objects, bool indexed) {
  for (const auto& o : objects)
    if (o.value("kind", "") == "Job" && (o["spec"].value("completionMode", "") == "Indexed") == indexed)
      return o;
  throw std::runtime_error(std::string("deploy/k8s has no ") + (indexed ? "Indexed " : "") + "Job");
}

const json& container(const json& job) {
  const json& containers = job["spec"]["template"]["spec"]["containers"];
  if (containers.size() != 1) throw std::runtime_error("expected one container per pod");
  return containers[0];
}

std::vector<std::string> command_line(const json& c) {
  std::vector<std::string> argv = c.value("command", std::vector<std::string>{});
  for (const auto& a : c.value("args", std::vector<std::string>{})) argv.push_back(a);
  return argv;
}

// The value of `--set key=VALUE` in a command line ("" if absent).
std::string set_value(const std::vector<std::string>& argv, const std::string& key) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--set" && argv[i + 1].rfind(key + "=", 0) == 0) return argv[i + 1].substr(key.size() + 1);
  return "";
}

std::string flag_value(const std::vector<std::string>& argv, const std::string& flag) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) return argv[i + 1];
  return "";
}

bool selects(const json& selector, const json& labels) {
  for (const auto& [key, value] : selector.items())
    if (!labels.contains(key) || labels[key] != value) return false;
  return true;
}

// The kubelet's $(VAR) expansion: a defined variable is replaced, $$ is a
// literal $, anything else stays as written.
std::string expand(const std::string& text, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '(') {
      const size_t close = text.find(')', i);
      if (close != std::string::npos) {
        auto it = vars.find(text.substr(i + 2, close - i - 2));
        if (it != vars.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += text[i];
  }
  return out;
}

TEST(KubernetesManifests, AgreeOnWorldSizeRestartsPortsAndFolders) {
  if (const std::string why = no_yaml(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const auto objects = load_manifests(dir.path());
  const json& coordinator = job(objects, false);
  const json& workers = job(objects, true);
  const auto serve = command_line(container(coordinator));
  const auto work = command_line(container(workers));
  ASSERT_GE(serve.size(), 2u);
  EXPECT_EQ(serve[1], "coordinator");
  EXPECT_EQ(work[1], "worker");

  // One worker pod per rank; Kubernetes replaces as many as the coordinator accepts.
  const std::string world_size = set_value(serve, "job.world_size");
  ASSERT_FALSE(world_size.empty()) << "the coordinator's command sets job.world_size";
  EXPECT_EQ(workers["spec"]["completions"].dump(), world_size);
  EXPECT_EQ(workers["spec"]["parallelism"].dump(), world_size);
  EXPECT_EQ(workers["spec"]["backoffLimit"].dump(), set_value(serve, "fault.max_restarts"));
  // The elastic range: at least 1, below the world size (a lost pod leaves the job running).
  const std::string min_ranks = set_value(serve, "elastic.min_ranks");
  ASSERT_FALSE(min_ranks.empty()) << "the coordinator's command sets elastic.min_ranks";
  EXPECT_GE(std::stoi(min_ranks), 1);
  EXPECT_LT(std::stoi(min_ranks), std::stoi(world_size));
  EXPECT_EQ(coordinator["spec"]["backoffLimit"], 0) << "the coordinator is not restarted";
  EXPECT_EQ(workers["spec"]["template"]["spec"]["restartPolicy"], "Never");
  bool bad_input_fails_the_job = false;
  for (const auto& rule : workers["spec"]["podFailurePolicy"]["rules"])
    if (rule["action"] == "FailJob" && rule["onExitCodes"]["operator"] == "In" &&
        rule["onExitCodes"]["values"].dump().find('2') != std::string::npos)
      bad_input_fails_the_job = true;
  EXPECT_TRUE(bad_input_fails_the_job) << "exit status 2 (bad input) must not be retried";

  // The workers' pods are named through a headless Service: a replacement keeps its slot.
  const json& workers_service = object(objects, "Service", workers["spec"]["template"]["spec"]["subdomain"]);
  EXPECT_EQ(workers_service["spec"]["clusterIP"], "None");
  EXPECT_TRUE(selects(workers_service["spec"]["selector"], workers["spec"]["template"]["metadata"]["labels"]));

  // The workers dial the coordinator's Service, which forwards its one port.
  const std::string dial = flag_value(work, "--coordinator");
  const std::string service_name = dial.substr(0, dial.find(':'));
  const json& service = object(objects, "Service", service_name);
  EXPECT_TRUE(selects(service["spec"]["selector"], coordinator["spec"]["template"]["metadata"]["labels"]));
  std::set<std::string> ports;
  for (const auto& p : service["spec"]["ports"]) {
    EXPECT_EQ(p["port"], p["targetPort"]) << "the test resolves the Service to its pod: " << p.dump();
    ports.insert(p["port"].dump());
  }
  const std::string listen = flag_value(serve, "--listen");
  EXPECT_EQ(dial.substr(dial.find(':') + 1), listen.substr(listen.rfind(':') + 1));
  EXPECT_EQ(ports, (std::set<std::string>{listen.substr(listen.rfind(':') + 1)}));

  // Both mount the run folders' claim at the same path, and job.run_dir is on it.
  std::map<std::string, std::string> claim_paths[2];
  for (int i = 0; i < 2; ++i) {
    const json& spec = (i == 0 ? coordinator : workers)["spec"]["template"]["spec"];
    for (const auto& m : container(i == 0 ? coordinator : workers)["volumeMounts"])
      for (const auto& v : spec["volumes"])
        if (v["name"] == m["name"] && v.contains("persistentVolumeClaim"))
          claim_paths[i][v["persistentVolumeClaim"]["claimName"]] = m["mountPath"];
  }
  ASSERT_EQ(claim_paths[0].size(), 1u);
  EXPECT_EQ(claim_paths[0], claim_paths[1]);
  const auto& [claim, path] = *claim_paths[0].begin();
  EXPECT_NO_THROW(object(objects, "PersistentVolumeClaim", claim));
  EXPECT_EQ(set_value(serve, "job.run_dir").rfind(path + "/", 0), 0u) << set_value(serve, "job.run_dir");
  // Ready when the coordinator answers gRPC's health service on its own port
  // (Coordinator.AnswersTheStandardGrpcHealthCheck... checks the answer).
  const json& probe = container(coordinator)["readinessProbe"];
  ASSERT_TRUE(probe.contains("grpc")) << container(coordinator).dump(2);
  EXPECT_EQ(probe["grpc"]["port"], container(coordinator)["ports"][0]["containerPort"]);
}

class KubernetesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = NetHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
    if (const std::string why = no_yaml(); !why.empty()) GTEST_SKIP() << why;
    objects = load_manifests(dir.path());
    hosts = std::make_unique<NetHosts>(dir.path());
  }

  void TearDown() override {
    processes.clear();  // the pods end before their mount points go
    for (auto it = created_mount_points.rbegin(); it != created_mount_points.rend(); ++it)
      fs::remove(*it);  // empty folders this test made; never anything else
  }

  std::string folder(const std::string& name) {
    const std::string path = dir.path() + "/" + name;
    fs::create_directories(path);
    return path;
  }

  // The mount path exists on this machine (mounts go into the pod's own
  // mount namespace only); folders made for it are removed at the end.
  void ensure_mount_point(const fs::path& target) {
    std::vector<fs::path> missing;
    for (fs::path p = target; !p.empty() && !fs::exists(p); p = p.parent_path()) missing.push_back(p);
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      fs::create_directory(*it);
      created_mount_points.push_back(*it);
    }
  }

  // Starts one pod of `job` (index -1 when not Indexed) as pod `pod_name`
  // on namespace host `host`.
  LockstepProcess& start_pod(const json& job, const std::string& host, const std::string& pod_name,
                             int index) {
    const json& spec = job["spec"]["template"]["spec"];
    const json& c = container(job);
    std::map<std::string, std::string> vars;
    std::vector<std::string> env;
    auto define = [&](const std::string& name, const std::string& value) {
      vars[name] = value;
      env.push_back(name + "=" + value);
    };
    define("HOSTNAME", host_name_of(job, pod_name, index));
    if (index >= 0) define("JOB_COMPLETION_INDEX", std::to_string(index));
    for (const auto& s : objects) {  // the kubelet's variables of each (non-headless) Service
      if (s.value("kind", "") != "Service" || s["spec"].value("clusterIP", "") == "None") continue;
      std::string prefix = s["metadata"]["name"];
      for (auto& ch : prefix) ch = ch == '-' ? '_' : char(std::toupper(ch));
      define(prefix + "_SERVICE_HOST", hosts->address(coordinator_host));
      define(prefix + "_SERVICE_PORT", s["spec"]["ports"][0]["port"].dump());
    }
    for (const auto& e : c.value("env", json::array())) {
      const std::string name = e["name"];
      if (e.contains("value")) {
        define(name, expand(e["value"], vars));
      } else if (e["valueFrom"].contains("fieldRef")) {
        const std::string field = e["valueFrom"]["fieldRef"]["fieldPath"];
        if (field == "status.podIP") define(name, hosts->address(host));
        else if (field == "metadata.name") define(name, pod_name);
        else if (field == kIndexAnnotation && index >= 0) define(name, std::to_string(index));
        else throw std::runtime_error("the test does not give field " + field + " (env " + name + ")");
      } else if (e["valueFrom"].contains("secretKeyRef")) {
        const json& ref = e["valueFrom"]["secretKeyRef"];
        const std::string key = ref["name"].get<std::string>() + "/" + ref["key"].get<std::string>();
        if (!secrets.count(key)) throw std::runtime_error("no Secret key " + key + " (env " + name + ")");
        define(name, secrets[key]);
      } else {
        throw std::runtime_error("the test does not give env " + e.dump());
      }
    }

    std::vector<NetHosts::Mount> mounts;
    for (const auto& m : c.value("volumeMounts", json::array())) {
      std::string source;
      for (const auto& v : spec["volumes"]) {
        if (v["name"] != m["name"]) continue;
        if (v.contains("configMap")) source = config_maps.at(v["configMap"]["name"]);
        else if (v.contains("persistentVolumeClaim")) source = folder("claim-" + v["persistentVolumeClaim"]["claimName"].get<std::string>());
        else if (v.contains("emptyDir")) source = folder(pod_name + "-" + m["name"].get<std::string>());
      }
      if (source.empty()) throw std::runtime_error("the test cannot provide volume " + m.dump());
      ensure_mount_point(m["mountPath"].get<std::string>());
      mounts.push_back({source, m["mountPath"]});
    }

    std::vector<std::string> argv;
    for (const auto& a : command_line(c)) argv.push_back(expand(a, vars));
    if (argv.empty() || argv[0] != "lockstep")
      throw std::runtime_error("the container's command does not start with lockstep");
    argv.erase(argv.begin());
    processes.push_back(std::make_unique<LockstepProcess>(argv, folder(pod_name), env,
                                                           hosts->on(host, mounts)));
    return *processes.back();
  }

  // A pod's host name: <job>-<index> for an Indexed Job's pod with a
  // subdomain (what keeps a replacement's name), else the pod's name.
  std::string host_name_of(const json& job, const std::string& pod_name, int index) const {
    if (index >= 0 && job["spec"]["template"]["spec"].contains("subdomain"))
      return job["metadata"]["name"].get<std::string>() + "-" + std::to_string(index);
    return pod_name;
  }

  TempDir dir;
  std::vector<json> objects;
  std::unique_ptr<NetHosts> hosts;
  std::vector<fs::path> created_mount_points;
  std::vector<std::unique_ptr<LockstepProcess>> processes;  // destroyed first
  std::map<std::string, std::string> secrets;      // "secret/key" -> value
  std::map<std::string, std::string> config_maps;  // name -> folder of its files
  std::string coordinator_host;
};

// The steps of the newest complete checkpoint under the claim's run folders (-1: none).
int64_t newest_checkpoint(const std::string& runs) {
  int64_t newest = -1;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(runs, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) == 0 && fs::exists(it->path() / "index.json"))
      newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
  }
  return newest;
}

TEST_F(KubernetesTest, ShippedManifestsTrainAndReplaceALostWorkerPod) {
  const json& coordinator_job = job(objects, false);
  const json& workers_job = job(objects, true);
  const int world_size = workers_job["spec"]["completions"];
  const int backoff_limit = workers_job["spec"]["backoffLimit"];

  // What docs/slurm-and-kubernetes.md has the user create: the token Secret and the job file's ConfigMap.
  secrets["lockstep-token/token"] = kToken;
  std::string job_text;
  {
    std::ifstream in(examples_dir() + "/synthetic.toml");
    job_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  job_text = std::regex_replace(job_text, std::regex("\nsteps = 40\n"),
                                "\nsteps = 1000\nthreads_per_rank = 1\n");
  job_text += "\n[checkpoint]\nevery = 50\n\n[fault]\nheartbeat_s = 0.5\nheartbeat_timeout_s = 5\n";
  config_maps["lockstep-job"] = folder("configmap-lockstep-job");
  std::ofstream(config_maps["lockstep-job"] + "/job.toml") << job_text;

  // The coordinator's pod, its Service's name resolving to it on every worker host.
  coordinator_host = "lockstep-coordinator-h8x2q";
  hosts->add(coordinator_host);
  const std::string service = object(objects, "Service", "lockstep-coordinator")["metadata"]["name"];
  std::vector<std::string> worker_hosts;
  auto add_worker_host = [&](int index, const std::string& pod_name) {
    hosts->add(pod_name, NetHosts::Names::kResolvable, host_name_of(workers_job, pod_name, index));
    hosts->alias(pod_name, service, hosts->address(coordinator_host));
    return pod_name;
  };
  // Kubernetes starts pods in any order: the workers first.
  std::vector<LockstepProcess*> workers;
  for (int i = 0; i < world_size; ++i) {
    const std::string pod = add_worker_host(i, "lockstep-workers-" + std::to_string(i) + "-pod1");
    workers.push_back(&start_pod(workers_job, pod, pod, i));
  }
  auto& coordinator = start_pod(coordinator_job, coordinator_host, coordinator_host, -1);

  const std::string runs = dir.path() + "/claim-lockstep-runs";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (newest_checkpoint(runs) < 50 && coordinator.running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(newest_checkpoint(runs), 50) << coordinator.output() << workers[1]->output();

  // Worker 1's pod dies (as an OOM kill would end it). The Job controller:
  // exit 137 is not in the FailJob rule, one failure is within backoffLimit
  // → a fresh pod of the same index, on another node, with the same name.
  workers[1]->kill_group();
  ASSERT_LT(newest_checkpoint(runs), 1000) << "the run ended before the kill: make it longer";
  const int exit_code = workers[1]->wait(10);
  EXPECT_EQ(exit_code, 128 + 9);
  ASSERT_GE(backoff_limit, 1);
  const std::string replacement = add_worker_host(1, "lockstep-workers-1-pod2");
  auto& replaced = start_pod(workers_job, replacement, replacement, 1);

  ASSERT_EQ(coordinator.wait(180), 0) << coordinator.output() << replaced.output();
  EXPECT_EQ(workers[0]->wait(30), 0) << workers[0]->output();
  EXPECT_EQ(replaced.wait(30), 0) << replaced.output();
  EXPECT_NE(coordinator.output().find("was replaced"), std::string::npos) << coordinator.output();
  // The manifests' elastic range: the survivor kept its state in memory and
  // sent it to the new pod; no checkpoint was read.
  EXPECT_NE(workers[0]->output().find("Decision: resume_from = memory"), std::string::npos) << workers[0]->output();
  EXPECT_EQ(coordinator.output().find(kToken), std::string::npos) << "the token is never printed";
  EXPECT_NE(workers[0]->output().find("Decision: gloo_address = " + hosts->address("lockstep-workers-0-pod1")),
            std::string::npos) << workers[0]->output();

  auto manifest = read_json(single_run(runs + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "completed") << manifest.dump(2);
  EXPECT_EQ(manifest["restart_count"], 1);

  // The same job on this host, uninterrupted, ends with the same parameters.
  TempDir local;
  auto reference = run_lockstep({"run", config_maps["lockstep-job"] + "/job.toml", "--set",
                                 "job.world_size=" + std::to_string(world_size), "--set",
                                 "job.run_dir=" + local.path() + "/runs"},
                                local.path(), 150);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_EQ(manifest["metrics"].value("final_param_digest", "missing"),
            read_json(single_run(local.path() + "/runs") + "/manifest.json")["metrics"].value(
                "final_param_digest", "none"));
}

// A worker pod with the wrong token: exit 2 (bad input), which the worker
// Job's podFailurePolicy turns into a failed Job instead of retries.
TEST_F(KubernetesTest, AWorkerPodWithTheWrongTokenFailsTheJobWithoutRetries) {
  const json& workers_job = job(objects, true);
  config_maps["lockstep-job"] = folder("configmap-lockstep-job");
  fs::copy_file(examples_dir() + "/synthetic.toml", config_maps["lockstep-job"] + "/job.toml");
  secrets["lockstep-token/token"] = kToken;
  coordinator_host = "lockstep-coordinator-q9w4r";
  hosts->add(coordinator_host);
  auto& coordinator = start_pod(job(objects, false), coordinator_host, coordinator_host, -1);
  secrets["lockstep-token/token"] = "a-different-token-of-another-job";
  const std::string pod = "lockstep-workers-0-pod1";
  hosts->add(pod, NetHosts::Names::kResolvable, host_name_of(workers_job, pod, 0));
  hosts->alias(pod, "lockstep-coordinator", hosts->address(coordinator_host));
  auto& worker = start_pod(workers_job, pod, pod, 0);
  const int exit_code = worker.wait(60);
  EXPECT_EQ(exit_code, 2) << worker.output();
  EXPECT_NE(worker.output().find("wrong job token"), std::string::npos) << worker.output();
  bool fails_the_job = false;
  for (const auto& rule : workers_job["spec"]["podFailurePolicy"]["rules"])
    if (rule["action"] == "FailJob")
      for (const auto& value : rule["onExitCodes"]["values"]) fails_the_job |= value == exit_code;
  EXPECT_TRUE(fails_the_job) << "exit " << exit_code << " would be retried up to backoffLimit times";
  coordinator.signal(SIGTERM);
  EXPECT_EQ(coordinator.wait(30), 1) << coordinator.output();
}

}  // namespace
}  // namespace lockstep::testing
