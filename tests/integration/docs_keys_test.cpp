// The README's key tables (each table whose header starts `| key |`) against
// `lockstep keys --json`, the keys the binary really reads: every key is
// documented (in a table, or as a test switch in backquotes), and every
// key a table names exists. Shown to catch a broken table on a copy of the
// README with one key misspelt on purpose.
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "support/cli_runner.h"

namespace lockstep::testing {
namespace {

// What is wrong with `doc`'s key tables against `keys`; empty when nothing is.
std::vector<std::string> key_table_problems(const std::string& doc, const std::vector<std::string>& keys) {
  std::set<std::string> documented;
  const std::regex name("[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)?");
  std::istringstream lines(doc);
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| key |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (line.rfind("|", 0) != 0) {
      in_table = false;
      continue;
    }
    if (!in_table || line.rfind("| ---", 0) == 0) continue;
    const std::string first = line.substr(1, line.find('|', 1) - 1);
    for (std::sregex_iterator it(first.begin(), first.end(), name), end; it != end; ++it) documented.insert(it->str());
  }
  // Test switches are documented in prose, each in backquotes.
  for (const auto& key : keys)
    if (key.rfind("test.", 0) == 0 && doc.find("`" + key + "`") != std::string::npos) documented.insert(key);
  std::vector<std::string> problems;
  std::set<std::string> known(keys.begin(), keys.end());
  known.insert("precision");  // the job file's shorthand for precision.dtype (`precision = "bf16"`)
  for (const auto& key : keys)
    if (!documented.count(key)) problems.push_back("key " + key + " is in no key table");
  for (const auto& key : documented)
    if (!known.count(key)) problems.push_back("a key table names " + key + ", which lockstep does not read");
  return problems;
}

std::vector<std::string> lockstep_keys() {
  TempDir dir;
  auto result = run_lockstep({"keys", "--json"}, dir.path(), 30);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> keys;
  for (const auto& entry : nlohmann::json::parse(result.output.substr(result.output.find('['))))
    keys.push_back(entry["key"]);
  return keys;
}

std::string readme() {
  std::ifstream in(std::string(LOCKSTEP_SOURCE_DIR) + "/README.md");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(DocsKeys, EveryKeyTheBinaryReadsIsInTheReadmesKeyTablesAndNoOther) {
  const auto keys = lockstep_keys();
  ASSERT_GT(keys.size(), 50u);
  const auto problems = key_table_problems(readme(), keys);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

TEST(DocsKeys, AMisspeltKeyInACopyOfTheReadmeIsCaught) {
  const auto keys = lockstep_keys();
  std::string broken = readme();
  const std::string row = "| optim.clip_norm |";
  const size_t at = broken.find(row);
  ASSERT_NE(at, std::string::npos) << "the README has no row for optim.clip_norm";
  broken.replace(at, row.size(), "| optim.clipnorm |");
  const auto problems = key_table_problems(broken, keys);
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0], "key optim.clip_norm is in no key table");
  EXPECT_EQ(problems[1], "a key table names optim.clipnorm, which lockstep does not read");
}

}  // namespace
}  // namespace lockstep::testing
