#pragma once
// A dynamic loss scale for low-precision gradients (LibTorch 1.13 has no C++
// GradScaler). The loss is multiplied by scale() before backward; after the
// gradients are reduced, update() is told whether any of them is inf or NaN
// (computed from the all-reduced buffer, so every rank gives the same
// answer and a step is skipped on every rank or on none). A skipped step
// multiplies the scale by the backoff; `growth_interval` steps in a row
// without one multiply it by the growth factor. Every skip is counted with
// its step and the new scale. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::optim {

struct ScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// The defaults lockstep chooses for a run of `steps` optimizer steps, with
// the reason: a short run does not start at 65536 (each of the first
// overflows would cost a step) and grows its scale sooner.
struct ChosenScalerOptions {
  ScalerOptions options;
  std::string reason;
};
ChosenScalerOptions choose_scaler_options(int64_t steps, double init_scale, int64_t growth_interval);

class GradScaler {
 public:
  explicit GradScaler(ScalerOptions options);

  double scale() const { return scale_; }
  // After step `step` (1-based) with the reduced gradients' verdict. Returns
  // true when the optimizer may step, false when this step is skipped.
  bool update(int64_t step, bool found_nonfinite);

  int64_t skipped() const { return int64_t(skipped_steps_.size()); }
  int64_t steps_seen() const { return steps_seen_; }
  // {"step": s, "scale_after": x} per skipped step, in order.
  const nlohmann::json& skipped_steps() const { return skipped_steps_; }
  // The whole state, for checkpoints; load() restores it bit for bit.
  nlohmann::json state() const;
  void load(const nlohmann::json& state);

 private:
  ScalerOptions options_;
  double scale_;
  int64_t good_in_a_row_ = 0;
  int64_t steps_seen_ = 0;
  nlohmann::json skipped_steps_ = nlohmann::json::array();
};

}  // namespace lockstep::optim
