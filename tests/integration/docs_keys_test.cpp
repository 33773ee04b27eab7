// The keys table of docs/jobs-and-keys.md (its tables whose header starts
// `| key |`) against `lockstep keys --json`, the keys the binary really
// reads: every key is documented there (in a table, or as a test switch in
// backquotes), and every key a table names exists; a key table on any other
// page (README.md, docs/*.md) names only keys that exist. Shown to catch a
// broken table on a copy of the page with one key misspelt on purpose.
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "support/cli_runner.h"

namespace lockstep::testing {
namespace {

// What is wrong with `doc`'s key tables against `keys`; empty when nothing
// is. `complete`: every key must be in them.
std::vector<std::string> key_table_problems(const std::string& doc, const std::vector<std::string>& keys,
                                            bool complete = true) {
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
    if (complete && !documented.count(key)) problems.push_back("key " + key + " is in no key table");
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

std::string read_page(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const std::string kKeysPage = std::string(LOCKSTEP_SOURCE_DIR) + "/docs/jobs-and-keys.md";

TEST(DocsKeys, EveryKeyTheBinaryReadsIsInTheKeysTableAndNoOther) {
  const auto keys = lockstep_keys();
  ASSERT_GT(keys.size(), 50u);
  const auto problems = key_table_problems(read_page(kKeysPage), keys);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

TEST(DocsKeys, KeyTablesOnEveryOtherPageNameOnlyKeysThatExist) {
  const auto keys = lockstep_keys();
  std::vector<std::string> pages = {std::string(LOCKSTEP_SOURCE_DIR) + "/README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LOCKSTEP_SOURCE_DIR) + "/docs"))
    if (entry.path().extension() == ".md" && entry.path() != kKeysPage) pages.push_back(entry.path());
  ASSERT_GT(pages.size(), 10u);
  for (const auto& page : pages) {
    const auto problems = key_table_problems(read_page(page), keys, /*complete=*/false);
    EXPECT_TRUE(problems.empty()) << page << ": " << ::testing::PrintToString(problems);
  }
}

TEST(DocsKeys, AMisspeltKeyInACopyOfTheKeysPageIsCaught) {
  const auto keys = lockstep_keys();
  std::string broken = read_page(kKeysPage);
  const std::string row = "| optim.clip_norm |";
  const size_t at = broken.find(row);
  ASSERT_NE(at, std::string::npos) << kKeysPage << " has no row for optim.clip_norm";
  broken.replace(at, row.size(), "| optim.clipnorm |");
  const auto problems = key_table_problems(broken, keys);
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0], "key optim.clip_norm is in no key table");
  EXPECT_EQ(problems[1], "a key table names optim.clipnorm, which lockstep does not read");
}

}  // namespace
}  // namespace lockstep::testing
