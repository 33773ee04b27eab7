#pragma once
// `lockstep compare RUN_A RUN_B`: whether two runs of a job ended on the
// same parameters, and where they parted if not. Reads each run folder's
// manifest (the final parameter digest) and rank 0's audit evidence (a
// digest and a sum per tensor at every audited step): "bit-identical" when
// the final digests match; otherwise the first audited step, present in
// both, whose evidence differs, the tensors that differ there and the
// largest difference of their sums. Never trusts the files: bad or missing
// evidence is exit 2 naming the file.
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

struct RunComparison {
  int exit_code = 0;    // 0 bit-identical, 1 they differ, 2 a run folder cannot be read
  std::string text;     // for people
  nlohmann::json json;  // for scripts
};

RunComparison compare_runs(const std::string& run_a, const std::string& run_b);

}  // namespace lockstep
