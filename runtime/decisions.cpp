#include "runtime/decisions.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace lockstep {

void DecisionLog::record(std::string what, std::string value, std::string reason, bool warn) {
  if (warn) {
    spdlog::warn("Decision: {} = {} ({})", what, value, reason);
  } else {
    spdlog::info("Decision: {} = {} ({})", what, value, reason);
  }
  decisions_.push_back({std::move(what), std::move(value), std::move(reason)});
}

nlohmann::json DecisionLog::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& d : decisions_)
    out.push_back({{"what", d.what}, {"value", d.value}, {"reason", d.reason}});
  return out;
}

}  // namespace lockstep
