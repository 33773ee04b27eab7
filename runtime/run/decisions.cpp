#include "runtime/run/decisions.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <map>

namespace lockstep {

void DecisionLog::print(const Decision& d, const std::string& ranks) const {
  const std::string suffix = ranks.empty() ? "" : " [" + ranks + "]";
  if (d.warn) {
    spdlog::warn("Decision: {} = {} ({}){}", d.what, d.value, d.reason, suffix);
  } else {
    spdlog::info("Decision: {} = {} ({}){}", d.what, d.value, d.reason, suffix);
  }
}

void DecisionLog::record(std::string what, std::string value, std::string reason, bool warn) {
  decisions_.push_back({std::move(what), std::move(value), std::move(reason), warn});
  if (!holding_) print(decisions_.back(), "");
}

void DecisionLog::hold() {
  if (holding_) return;
  holding_ = true;
  held_from_ = decisions_.size();
}

std::string DecisionLog::held_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = held_from_; i < decisions_.size(); ++i)
    out.push_back({decisions_[i].what, decisions_[i].value, decisions_[i].reason});
  return out.dump();
}

namespace {

// (what, how many times before) -> value and reason, for matching the
// same decision across ranks even when one is made more than once.
using DecisionKey = std::pair<std::string, int>;

std::map<DecisionKey, std::pair<std::string, std::string>> index_decisions(const std::string& held) {
  std::map<DecisionKey, std::pair<std::string, std::string>> out;
  std::map<std::string, int> seen;
  const auto parsed = nlohmann::json::parse(held, nullptr, false);
  if (!parsed.is_array()) return out;
  for (const auto& d : parsed)
    if (d.is_array() && d.size() == 3 && d[0].is_string() && d[1].is_string() && d[2].is_string())
      out[{d[0].get<std::string>(), seen[d[0].get<std::string>()]++}] = {d[1].get<std::string>(),
                                                                         d[2].get<std::string>()};
  return out;
}

std::string describe_ranks(const std::vector<int>& ranks, size_t world) {
  if (ranks.size() == world) return "all " + std::to_string(world) + " ranks";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void DecisionLog::print_held(int rank, const std::vector<std::string>& held_by_rank) {
  if (!holding_) return;
  std::vector<std::map<DecisionKey, std::pair<std::string, std::string>>> ranks;
  for (const auto& held : held_by_rank) ranks.push_back(index_decisions(held));
  std::map<std::string, int> seen;
  for (size_t i = held_from_; i < decisions_.size(); ++i) {
    const Decision& d = decisions_[i];
    const DecisionKey key{d.what, seen[d.what]++};
    const std::pair<std::string, std::string> mine{d.value, d.reason};
    if (ranks.size() <= 1) {
      print(d, "");
    } else if (rank == 0) {
      std::vector<int> same;
      for (size_t r = 0; r < ranks.size(); ++r) {
        auto it = ranks[r].find(key);
        if (it != ranks[r].end() && it->second == mine) same.push_back(int(r));
      }
      print(d, describe_ranks(same, ranks.size()));
    } else {
      auto it = ranks[0].find(key);
      if (it == ranks[0].end() || it->second != mine) print(d, "rank " + std::to_string(rank));
    }
  }
  holding_ = false;
  held_from_ = decisions_.size();
}

DecisionLog::~DecisionLog() {
  if (!holding_) return;
  for (size_t i = held_from_; i < decisions_.size(); ++i) print(decisions_[i], "");
}

nlohmann::json DecisionLog::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& d : decisions_)
    out.push_back({{"what", d.what}, {"value", d.value}, {"reason", d.reason}});
  return out;
}

}  // namespace lockstep
