#pragma once
// The start-up checks of a job file on the host that reads it (the launcher
// of `lockstep run`, `lockstep coordinator`, `lockstep worker JOB.toml`):
// its keys, the faults it injects, the machine it asks for, its data files.
// What they find is bad input (InputError, exit 2) before any process,
// port or run folder exists.
#include <string>
#include <vector>

#include "runtime/job/config.h"

namespace lockstep {

// The job file with `overrides` on top, checked as far as this host can:
// every key, fault.inject and precision.fp32_modules against the model
// (when this host has the model), and the device it asks for.
JobConfig checked_job(const std::string& job_file, const std::vector<std::string>& overrides);

// The devices the job asks for against this host's, where the ranks run
// on this host (`lockstep run`, a torchrun-style worker): device = gpu, or
// precision = fp16, with no CUDA device visible is InputError.
void check_devices_here(const JobConfig& config);

// Where the data files are read from decides who checks them.
enum class DataHost {
  this_host,      // `lockstep run`: the workers share this host; a missing file is bad input
  workers_hosts,  // `lockstep coordinator`: checked here only when this host has them too
};

// The data files (sizes, headers, labels) before anything starts; under
// workers_hosts a data.path absent here is said in a decision instead.
void check_data_files(const DataSection& data, DataHost where);

}  // namespace lockstep
