#include "runtime/startup/job_checks.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/data/dataset.h"
#include "runtime/model/models.h"
#include "runtime/precision/machine.h"
#include "runtime/startup/model_checks.h"

namespace lockstep {

JobConfig checked_job(const std::string& job_file, const std::vector<std::string>& overrides) {
  JobConfig config = load_job_config(job_file, overrides);
  // An unknown model, or fault.inject / precision.fp32_modules naming what
  // the model lacks, is bad input before any process starts.
  if (config.model.name == "torchscript" && !std::filesystem::exists(config.model.path))
    spdlog::info("Decision: model_check = on the workers' hosts (model.path {} is not on this host; "
                 "each worker checks its own copy as it loads it, exit 2 if it is not a module)",
                 config.model.path);
  else
    check_injected_faults(config, ModelRegistry::with_builtins());
  check_machine_request(config);  // device = gpu on a CPU build, ...
  return config;
}

void check_devices_here(const JobConfig& config) { check_devices_visible(config); }

void check_data_files(const DataSection& data, DataHost where) {
  // The built-in dataset's default folder is the one place a coordinator
  // host may lack what every worker host has.
  if (where == DataHost::workers_hosts && data.name == "fashion-mnist" && !std::filesystem::exists(data.path)) {
    spdlog::info("Decision: data_check = on the workers' hosts (data.path {} is not on this host; each "
                 "worker checks its own copy as it loads it, exit 2 if damaged)", data.path);
    return;
  }
  validate_data_files(data);
}

}  // namespace lockstep
