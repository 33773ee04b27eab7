#pragma once
// `--resume RUN_DIR` on `lockstep run` and `lockstep coordinator`: which
// run and checkpoint it continues, with what settings, and whether anything
// is left to train. Decided before anything starts, so that a refused resume
// writes nothing into the run it names.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/config.h"

namespace lockstep {

struct ResumePlan {
  std::string run_id;     // "" without --resume
  int64_t step = -1;      // the newest checkpoint that verifies (-1: none)
  std::string checkpoint_folder;
  nlohmann::json meta;    // its index's description of the run
};

// The run folder's id and newest verifiable checkpoint (InputError when
// there is none). That checkpoint's effective settings become the base of
// `overrides` and the user's --set go on top (test.* switches do not carry
// over); job.run_dir and checkpoint.resume are appended. "" run id without
// --resume.
ResumePlan plan_resume(const std::string& resume_dir, std::vector<std::string>& overrides);

// A resume with nothing left to train is said, not run: past the end, or a
// setting a resumed run must keep changed, is InputError; exactly at the
// end is done (true).
bool resume_is_already_done(const ResumePlan& plan, const JobConfig& config);

}  // namespace lockstep
