// What a client without the token, or a hostile one with it, can do to a
// running job: nothing. The rendezvous store is behind the token, a stalled
// connection on any port the job listens on blocks no one, nested JSON is
// refused, and a flood of wrong tokens does not flood the log.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "integration/cluster.h"
#include "runtime/checkpoint/checkpoint_store.h"

namespace lockstep::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The TCP ports process `pid` listens on, with their local addresses:
// its socket inodes (/proc/PID/fd) matched against /proc/net/tcp{,6}.
std::map<int, std::string> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = ::opendir(fds.c_str())) {
    while (dirent* entry = ::readdir(dir)) {
      char target[256];
      const std::string link = fds + "/" + entry->d_name;
      ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      std::string text(target);
      if (text.rfind("socket:[", 0) == 0) inodes.insert(text.substr(8, text.size() - 9));
    }
    ::closedir(dir);
  }
  std::map<int, std::string> ports;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      const auto colon = local.rfind(':');
      ports[std::stoi(local.substr(colon + 1), nullptr, 16)] = local.substr(0, colon);
    }
  }
  return ports;
}

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

v1::StoreRequest store_request(const std::string& run_id, v1::StoreRequest::Op op, const std::string& key) {
  v1::StoreRequest r;
  r.set_run_id(run_id);
  r.set_op(op);
  if (!key.empty()) r.add_keys(key);
  r.set_value("intruder");
  return r;
}

TEST(Hardening, TheStoreIsBehindTheTokenAndTheCoordinatorListensOnOnePort) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=100000", "fault.heartbeat_s=0.5"});
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  const std::string run_id = cluster.status().run_id();

  // Without the token: no operation reaches a key.
  auto stranger = cluster.client("not-the-token-of-this-job");
  for (auto op : {v1::StoreRequest::GET, v1::StoreRequest::SET, v1::StoreRequest::DELETE,
                  v1::StoreRequest::ADD, v1::StoreRequest::NUM_KEYS, v1::StoreRequest::CHECK}) {
    v1::StoreReply reply;
    auto status = stranger.store(store_request(run_id, op, op == v1::StoreRequest::NUM_KEYS ? "" : "k"),
                                 &reply, std::chrono::seconds(5));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << v1::StoreRequest::Op_Name(op) << ": " << describe(status);
  }
  // With it, the store is there and holds the ranks' keys (Gloo's addresses).
  v1::StoreReply keys;
  ASSERT_TRUE(cluster.client().store(store_request(run_id, v1::StoreRequest::NUM_KEYS, ""), &keys,
                                     std::chrono::seconds(5)).ok());
  EXPECT_GT(keys.number(), 2);
  v1::StoreReply ignored;
  EXPECT_EQ(cluster.client().store(store_request("another-run", v1::StoreRequest::GET, "k"), &ignored,
                                   std::chrono::seconds(5)).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // The coordinator listens on its gRPC port alone, on the --listen address.
  auto ports = listening_ports(cluster.coordinator->pid());
  ASSERT_EQ(ports.size(), 1u) << "the coordinator listens on more than its gRPC port";
  EXPECT_EQ(ports.begin()->first, cluster.port);
  // 127.0.0.1 (or its IPv4-mapped IPv6 form), not every interface.
  EXPECT_TRUE(ports.begin()->second == "0100007F" ||
              ports.begin()->second == "0000000000000000FFFF00000100007F")
      << ports.begin()->second;

  // 200 clients with a wrong token: refused, in a few log lines, and the job goes on.
  const std::string output_before = cluster.coordinator->output();
  const size_t lines_before = std::count(output_before.begin(), output_before.end(), '\n');
  for (int i = 0; i < 200; ++i) {
    v1::StatusReply status;
    auto client = cluster.client("wrong-token-number-" + std::to_string(i));
    EXPECT_EQ(client.status(&status, std::chrono::seconds(5)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  const int64_t before = cluster.min_step();
  EXPECT_TRUE(cluster.wait_for_steps(before + 10, 30));
  const std::string& out = cluster.coordinator->output();
  const size_t refusal_lines = [&] {
    size_t n = 0;
    for (size_t at = out.find("wrong job token"); at != std::string::npos; at = out.find("wrong job token", at + 1)) ++n;
    return n;
  }();
  EXPECT_GE(refusal_lines, 1u);
  EXPECT_LE(refusal_lines, 3u) << "wrong-token warnings are not rate-limited";
  EXPECT_LE(std::count(out.begin(), out.end(), '\n') - lines_before, 40) << out.substr(out.size() - 2000);
  a.kill_group();
  b.kill_group();
}

TEST(Hardening, OneByteHeldOnEveryPortTheJobListensOnStallsNothing) {
  TempDir dir;
  // Checkpoints and their barriers every 10 steps; a 2 s barrier timeout.
  // The job is ended by a stop (SIGUSR1), not by its step count: a fixed
  // count small enough to end soon was over before the hold on a fast CPU.
  Cluster cluster(dir, {"job.steps=100000", "fault.heartbeat_s=0.5", "comm.barrier_timeout_s=2",
                        "checkpoint.every=10"});
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();

  std::set<int> ports;
  for (pid_t pid : {cluster.coordinator->pid(), a.pid(), b.pid()})
    for (const auto& [port, address] : listening_ports(pid)) ports.insert(port);
  ASSERT_GE(ports.size(), 1u);
  std::vector<int> held;
  for (int port : ports) {
    int fd = connect_to(port);
    ASSERT_GE(fd, 0) << "port " << port;
    ASSERT_EQ(::write(fd, "x", 1), 1);
    held.push_back(fd);
  }
  // Held for twice the barrier timeout, while checkpoints (and barriers) pass.
  const int64_t before = cluster.min_step();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const int64_t during = cluster.min_step();
  EXPECT_GE(during, before + 10) << "training stalled while " << held.size()
                                 << " connections held one byte each";
  // A stop, still holding: one more agreed step, a checkpoint and its barrier.
  const auto start = Clock::now();
  cluster.coordinator->signal(SIGUSR1);
  EXPECT_EQ(cluster.coordinator->wait(90), 75) << cluster.coordinator->output();
  EXPECT_EQ(a.wait(10), 0) << a.output();
  EXPECT_EQ(b.wait(10), 0) << b.output();
  for (int fd : held) ::close(fd);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 90.0);
  const auto manifest = read_json(single_run(dir.path() + "/runs") + "/manifest.json");
  EXPECT_EQ(manifest["status"], "stopped") << manifest.dump(2);
  EXPECT_GE(manifest.value("stopped_at_step", int64_t(0)), during);
}

TEST(Hardening, DeeplyNestedJsonIsRefusedByTheCoordinatorAndByAudit) {
  TempDir dir;
  Cluster cluster(dir, {"job.steps=100000", "fault.heartbeat_s=0.5"});
  auto& a = cluster.add_worker();
  auto& b = cluster.add_worker();
  ASSERT_TRUE(cluster.wait_for_steps(5, 60)) << cluster.coordinator->output();
  const auto status = cluster.status();

  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  v1::HeartbeatRequest beat;
  beat.set_run_id(status.run_id());
  beat.set_rank(0);
  beat.set_generation(status.generation());
  beat.set_step(cluster.min_step());
  beat.set_phase("train");
  beat.add_audits_json(deep);
  v1::HeartbeatReply reply;
  auto refused = cluster.client().heartbeat(beat, &reply, std::chrono::seconds(10));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << describe(refused);
  EXPECT_NE(refused.error_message().find("nested deeper than"), std::string::npos) << describe(refused);
  beat.set_audits_json(0, R"({"step": "seven"})");
  EXPECT_EQ(cluster.client().heartbeat(beat, &reply, std::chrono::seconds(10)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::ReportRequest report;
  report.set_run_id(status.run_id());
  report.set_rank(1);
  report.set_generation(status.generation());
  report.set_success(true);
  report.set_metrics_json("{\"a\":" + deep + "}");
  EXPECT_EQ(cluster.client().report(report, std::chrono::seconds(10)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // The coordinator lives on and the job goes on.
  const int64_t before = cluster.min_step();
  EXPECT_TRUE(cluster.wait_for_steps(before + 10, 30)) << cluster.coordinator->output();
  EXPECT_TRUE(cluster.coordinator->running());
  a.kill_group();
  b.kill_group();
}

// `lockstep audit` on a clean run's folder after one change to the evidence.
class TamperedEvidence : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = new TempDir;
    auto run = run_lockstep(synthetic_run(*source_, 2, {"job.steps=20", "audit.every=5"}), source_->path(), 120);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    folder_ = single_run(source_->path() + "/runs");
  }
  static void TearDownTestSuite() { delete source_; }

  // A copy of the clean folder, for one test to damage.
  std::string copy() {
    const std::string target = dir_.path() + "/run";
    fs::copy(folder_, target, fs::copy_options::recursive);
    return target;
  }
  CommandResult audit(const std::string& folder) { return run_lockstep({"audit", folder}, dir_.path(), 30); }

  static void rewrite_manifest(const std::string& folder, const std::function<void(nlohmann::json&)>& change) {
    auto manifest = read_json(folder + "/manifest.json");
    change(manifest);
    std::ofstream(folder + "/manifest.json") << manifest.dump();
  }

  static TempDir* source_;
  static std::string folder_;
  TempDir dir_;
};
TempDir* TamperedEvidence::source_ = nullptr;
std::string TamperedEvidence::folder_;

// `lockstep compare` reads two run folders the same way: a clean copy is
// bit-identical to its source; hostile or damaged evidence is exit 2
// naming the file, never a crash or a hang.
TEST_F(TamperedEvidence, CompareReadsRunFoldersWithinBounds) {
  auto compare = [&](const std::string& a, const std::string& b) {
    return run_lockstep({"compare", a, b}, dir_.path(), 30);
  };
  const std::string clean = copy();
  auto same = compare(folder_, clean);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("bit-identical"), std::string::npos) << same.output;

  auto damaged = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                     const std::string& said) {
    const std::string folder = dir_.path() + "/" + name;
    fs::copy(folder_, folder, fs::copy_options::recursive);
    damage(folder);
    auto result = compare(folder_, folder);
    EXPECT_EQ(result.exit_code, 2) << name << ": " << result.output;
    EXPECT_NE(result.output.find(said), std::string::npos) << name << ": " << result.output;
  };
  damaged("nested", [](const std::string& f) {
    std::ofstream(f + "/audit-rank0.jsonl", std::ios::app) << std::string(100000, '[') << "\n";
  }, "audit-rank0.jsonl");
  damaged("endless", [](const std::string& f) {  // one line of 40 MB, no newline
    std::ofstream(f + "/audit-rank0.jsonl", std::ios::app) << std::string(40 << 20, 'x');
  }, "audit-rank0.jsonl");
  damaged("shapeless", [](const std::string& f) {
    std::ofstream(f + "/audit-rank0.jsonl", std::ios::app) << "{\"step\": 3, \"tensors\": [1, 2]}\n";
  }, "not an audit line");
  damaged("folder", [](const std::string& f) {
    fs::remove(f + "/manifest.json");
    fs::create_directory(f + "/manifest.json");
  }, "manifest.json: missing or not a regular file");
  damaged("truncated", [](const std::string& f) {
    fs::resize_file(f + "/manifest.json", 40);
  }, "manifest.json: not a lockstep manifest");

  // A digest changed at one audit: different, first parted there.
  const std::string changed = dir_.path() + "/changed";
  fs::copy(folder_, changed, fs::copy_options::recursive);
  auto lines = read_json_lines(changed + "/audit-rank0.jsonl");
  ASSERT_GE(lines.size(), 2u);
  const std::string tensor = lines[1]["tensors"].begin().key();
  lines[1]["tensors"][tensor] = "00000000000000000000000000000000";
  {
    std::ofstream out(changed + "/audit-rank0.jsonl");
    for (const auto& line : lines) out << line.dump() << "\n";
  }
  rewrite_manifest(changed, [](nlohmann::json& m) { m["metrics"]["final_param_digest"] = "other"; });
  auto parted = compare(folder_, changed);
  EXPECT_EQ(parted.exit_code, 1) << parted.output;
  EXPECT_NE(parted.output.find("first parted at step " + std::to_string(lines[1]["step"].get<int64_t>())),
            std::string::npos) << parted.output;
  EXPECT_NE(parted.output.find(tensor), std::string::npos) << parted.output;
}

TEST_F(TamperedEvidence, TheUntouchedFolderAgrees) {
  auto clean = audit(copy());
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
}

TEST_F(TamperedEvidence, ANestedLineIsRefusedWithoutACrash) {
  const std::string folder = copy();
  std::ofstream(folder + "/audit-rank1.jsonl", std::ios::app)
      << std::string(200000, '[') << std::string(200000, ']') << "\n";
  auto result = audit(folder);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("nested deeper than 64 levels"), std::string::npos) << result.output;
}

TEST_F(TamperedEvidence, AWorldSizeThatDisagreesWithTheFilesIsInconsistent) {
  for (int world : {0, 1, -3}) {
    const std::string folder = copy();
    rewrite_manifest(folder, [&](nlohmann::json& m) { m["world_size"] = world; });
    auto result = audit(folder);
    EXPECT_EQ(result.exit_code, 2) << "world_size " << world << ": " << result.output;
    EXPECT_NE(result.output.find("world_size"), std::string::npos) << result.output;
    fs::remove_all(folder);
  }
  const std::string folder = copy();
  rewrite_manifest(folder, [](nlohmann::json& m) { m["world_size"] = "two"; });
  auto typed = audit(folder);
  EXPECT_EQ(typed.exit_code, 2) << typed.output;
  EXPECT_NE(typed.output.find("no integer world_size"), std::string::npos) << typed.output;
}

TEST_F(TamperedEvidence, ATensorDroppedFromOneRankIsInconsistent) {
  const std::string folder = copy();
  auto lines = read_json_lines(folder + "/audit-rank0.jsonl");
  ASSERT_FALSE(lines.empty());
  const std::string dropped = lines[0]["tensors"].begin().key();
  lines[0]["tensors"].erase(dropped);
  {
    std::ofstream out(folder + "/audit-rank0.jsonl");
    for (const auto& line : lines) out << line.dump() << "\n";
  }
  auto result = audit(folder);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("lacks tensor " + dropped), std::string::npos) << result.output;
}

TEST_F(TamperedEvidence, WrongTypesFoldersAndPipesAreNamedNotHung) {
  {
    const std::string folder = copy();
    std::ofstream(folder + "/audit-rank1.jsonl", std::ios::app) << R"({"step": 99, "tensors": {"w": 5}})" << "\n";
    auto result = audit(folder);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("not an audit line (tensor w has no string digest)"), std::string::npos)
        << result.output;
    fs::remove_all(folder);
  }
  {
    const std::string folder = copy();
    fs::remove(folder + "/manifest.json");
    fs::create_directory(folder + "/manifest.json");
    auto result = audit(folder);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("manifest.json: not a regular file"), std::string::npos) << result.output;
    fs::remove_all(folder);
  }
  const std::string folder = copy();
  fs::remove(folder + "/audit-rank1.jsonl");
  ASSERT_EQ(::mkfifo((folder + "/audit-rank1.jsonl").c_str(), 0600), 0);
  auto result = audit(folder);  // would block forever opening the pipe
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("audit-rank1.jsonl: not a regular file"), std::string::npos) << result.output;
}

TEST(Hardening, ASecondWriterOnALiveRunFolderIsRefusedNamingTheOwner) {
  TempDir dir;
  LockstepProcess first(synthetic_run(dir, 2, {"job.steps=400", "checkpoint.every=20", "audit.every=20",
                                               "fault.heartbeat_s=0.2"}), dir.path());
  ASSERT_TRUE(first.wait_for_output("step 40/", 60)) << first.output();
  const std::string folder = single_run(dir.path() + "/runs");
  const std::string manifest_before = [&] {
    std::ifstream in(folder + "/manifest.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto second = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--nproc", "2", "--resume", folder},
                             dir.path(), 60);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("run folder " + folder + " is in use: host "), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("pid " + std::to_string(first.pid()) + " is writing it"), std::string::npos)
      << second.output;
  {  // the refused writer changed nothing
    std::ifstream in(folder + "/manifest.json");
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), manifest_before);
  }
  EXPECT_EQ(first.wait(120), 0) << first.output();
  EXPECT_EQ(read_json(folder + "/manifest.json")["status"], "completed");
  auto audit = run_lockstep({"audit", folder}, dir.path(), 30);
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  // Once the writer has ended, the folder is free: resuming it is allowed.
  auto later = run_lockstep({"run", examples_dir() + "/synthetic.toml", "--nproc", "2", "--resume", folder,
                             "--set", "job.steps=420"}, dir.path(), 120);
  EXPECT_EQ(later.exit_code, 0) << later.output;
}

// A small tmpfs mounted for one test and unmounted (lazily, so a busy one
// goes too) whatever happens. Needs root.
class SmallDisk {
 public:
  SmallDisk(const std::string& path, int64_t bytes) : path_(path) {
    fs::create_directories(path);
    mounted_ = std::system(("mount -t tmpfs -o size=" + std::to_string(bytes) + " lockstep-test " + path +
                            " 2>/dev/null").c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) (void)std::system(("umount -l " + path_).c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

int64_t folder_bytes(const std::string& path) {
  int64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(path))
    if (entry.is_regular_file()) total += int64_t(entry.file_size());
  return total;
}

TEST(Hardening, AFullDiskIsOneClearErrorAndLeavesNoHalfFiles) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::vector<std::string> sets = {"job.steps=120", "checkpoint.every=10", "checkpoint.keep=2",
                                         "audit.every=1", "fault.heartbeat_s=0.2"};
  TempDir reference, dir;
  ASSERT_EQ(run_lockstep(synthetic_run(reference, 2, sets), reference.path(), 120).exit_code, 0);
  const int64_t needed = folder_bytes(single_run(reference.path() + "/runs"));
  SmallDisk disk(dir.path() + "/runs", needed / 2);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";

  auto full = run_lockstep(synthetic_run(dir, 2, sets), dir.path(), 120);
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_NE(full.output.find("No space left on device"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("cannot write " + dir.path() + "/runs/"), std::string::npos) << full.output;
  EXPECT_EQ(full.output.find("Aborted"), std::string::npos) << full.output;
  const std::string run = single_run(dir.path() + "/runs");
  for (const auto& entry : fs::recursive_directory_iterator(run)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "a temporary was left: " << entry.path();
    if (entry.is_regular_file() && name != ".lock")
      EXPECT_GT(entry.file_size(), 0u) << "an empty file was left: " << entry.path();
    if (name.size() > 6 && name.substr(name.size() - 6) == ".jsonl") {
      std::ifstream in(entry.path());
      int number = 0;
      for (std::string line; std::getline(in, line);) {
        ++number;
        EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded())
            << entry.path() << ":" << number << " was cut mid-line";
      }
    }
  }
  auto manifest = nlohmann::json::parse(std::ifstream(run + "/manifest.json"), nullptr, false);
  ASSERT_FALSE(manifest.is_discarded()) << "manifest.json is not JSON";
  EXPECT_EQ(manifest.value("status", ""), "failed") << manifest.dump(2);
  EXPECT_NE(manifest.value("error", "").find("No space left on device"), std::string::npos) << manifest.dump(2);
  EXPECT_TRUE(CheckpointStore(run + "/checkpoints").newest_valid(nullptr).has_value())
      << "the checkpoints written before the disk filled are gone";
}

TEST(Hardening, ShortWhitespaceAndNonFileTokensAreBadInputAndNeverShown) {
  TempDir dir;
  const std::string job = examples_dir() + "/synthetic.toml";
  auto short_token = run_lockstep({"coordinator", job, "--listen", "127.0.0.1:0"}, dir.path(), 30,
                                  {"LOCKSTEP_TOKEN=hunter2secret"});
  EXPECT_EQ(short_token.exit_code, 2) << short_token.output;
  EXPECT_NE(short_token.output.find("has 13 characters; it needs at least 16"), std::string::npos)
      << short_token.output;
  EXPECT_EQ(short_token.output.find("hunt"), std::string::npos) << "a short token was shown";

  auto spaced = run_lockstep({"run", job, "--nproc", "2"}, dir.path(), 30,
                             {"LOCKSTEP_TOKEN=                    "});
  EXPECT_EQ(spaced.exit_code, 2) << spaced.output;
  EXPECT_NE(spaced.output.find("holds whitespace"), std::string::npos) << spaced.output;

  std::ofstream(dir.path() + "/token") << "too-short\n";
  auto from_file = run_lockstep({"worker", "--coordinator", "127.0.0.1:1", "--token-file", dir.path() + "/token"},
                                dir.path(), 30);
  EXPECT_EQ(from_file.exit_code, 2) << from_file.output;
  EXPECT_NE(from_file.output.find("--token-file " + dir.path() + "/token has 9 characters"), std::string::npos)
      << from_file.output;
  EXPECT_EQ(from_file.output.find("too-short"), std::string::npos);

  auto device = run_lockstep({"worker", "--coordinator", "127.0.0.1:1", "--token-file", "/dev/zero"},
                             dir.path(), 30);
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_NE(device.output.find("/dev/zero: not a regular file"), std::string::npos) << device.output;
  EXPECT_FALSE(fs::exists(dir.path() + "/runs"));
}

}  // namespace
}  // namespace lockstep::testing
